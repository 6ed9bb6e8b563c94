"""`apprentice up` in a private home, on free ports, sharing the suite's broker: the environment and a runner
of the CLI in it (the end-to-end tests that drive a whole stack as a user would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.stack.ports import Ports

REPO = Path(__file__).resolve().parents[2]


@dataclass
class CliStack:
    home: Path
    ports: Ports
    env: dict[str, str]

    def apprentice(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`apprentice <args>` as a user of this stack runs it (its home tells the CLI where the stack is)."""
        return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.apprentice("status", "--json").stdout))


def cli_stack(tmp_path: Path, model: str, pod_id: str) -> CliStack:
    """Free ports, so it never collides with a stack (or test) that already listens on 50051...; the suite's
    broker is not this home's, so the stack is told to share it (APPRENTICE_USE_RUNNING_BROKER)."""
    ports, home = Ports(), tmp_path / "home"
    env = {**os.environ, "APPRENTICE_HOME": str(home), "APPRENTICE_MODEL": model,
           "APPRENTICE_USE_RUNNING_BROKER": "1", "APPRENTICE_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "APPRENTICE_INFERENCE_PORT": str(ports.inference), "APPRENTICE_WEIGHTS_PORT": str(ports.weights),
           "APPRENTICE_EXTRACTOR_PORT": str(ports.extractor), "APPRENTICE_INFERENCE_POD_ID": pod_id,
           "APPRENTICE_INFERENCE_HTTP_PORT": str(ports.http), "APPRENTICE_DASHBOARD_PORT": str(ports.dashboard),
           **{f"APPRENTICE_{n.upper()}_METRICS_PORT": str(p) for n, p in ports.metrics.items()}}
    return CliStack(home, ports, env)
