"""A bad grader config, or a removed runtime asked for, stops `apprentice serve grader` at start with a
message that says what to fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.grader import REPO

BAD = """
version: broken-1
tasks:
  - tenant: demo
    task: support
    graders:
      - {name: code, type: regex, pattern: "FORM-[0-9"}
      - {name: ok, type: kpi, kpi: resolved, weigth: 2}
"""


def serve(config: Path, tmp_path: Path, *cmd: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_GRADER_")}, **extra_env, "APPRENTICE_GRADER_CONFIG_PATH": str(config), "APPRENTICE_HOME": str(tmp_path),
           "APPRENTICE_GRADER_METRICS_PORT": "0", "APPRENTICE_LOG_JSON": "false",
           # nothing listens here: the config must be rejected before any connection is tried
           "APPRENTICE_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    return subprocess.run([sys.executable, *cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("cmd", [("-m", "services.grader"), ("-m", "tools.cli.main", "serve", "grader")])
def test_invalid_config_is_a_clear_error_at_start(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    cfg = tmp_path / "grader.yaml"
    cfg.write_text(BAD)
    out = serve(cfg, tmp_path, *cmd)
    assert out.returncode == 2, out.stderr
    assert f"invalid grader config {cfg}:" in out.stderr
    assert "tasks.0.graders.0.regex.pattern: invalid regular expression 'FORM-[0-9'" in out.stderr
    assert "tasks.0.graders.1.kpi.weigth: Extra inputs are not permitted" in out.stderr
    assert "APPRENTICE_GRADER_CONFIG_PATH" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    out = serve(tmp_path / "nope.yaml", tmp_path, "-m", "services.grader")
    assert out.returncode == 2 and "cannot read grader config" in out.stderr


def test_a_native_runtime_left_in_the_environment_is_refused_in_one_line(tmp_path: Path) -> None:
    """The native runtime was removed: asking for it stops the start (services/grader/settings.py says why)."""
    from services.grader.settings import DEFAULT_CONFIG

    out = serve(DEFAULT_CONFIG, tmp_path, "-m", "services.grader", APPRENTICE_GRADER_RUNTIME="native")
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("apprentice grader: APPRENTICE_GRADER_RUNTIME=native asks for a runtime that was removed")
