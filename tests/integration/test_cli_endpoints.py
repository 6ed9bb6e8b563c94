"""The CLI finds a stack on non-default ports from the endpoints recorded in its home: a real Weights gRPC
server on a free port and a real knowledge topic on the broker; `apprentice weights` and `apprentice
knowledge` run with no endpoint flag or variable and reach them, and explicit flags and variables still win
(a stale record is ignored: tests/unit/shared/test_stack_endpoints.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.weights.service import RunningServer, start
from services.weights.settings import LocalStoreSettings, WeightsSettings
from shared.contracts.stack_endpoints import StackEndpoints, write_endpoints
from shared.contracts.topics import Topics

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def weights_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", f"test-{uuid.uuid4().hex[:8]}.")  # no Kafka traffic here
    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"),
                               policy="manual")
    running = start(settings, consume=False)
    yield running
    running.stop(grace=1.0)


def _apprentice(home: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    # the broker's credentials stay (the session broker authorizes); every other setting comes from the home
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")
           or (k.startswith("APPRENTICE_KAFKA_") and k != "APPRENTICE_KAFKA_BOOTSTRAP")}
    env.update(APPRENTICE_HOME=str(home), **env_extra)
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def test_cli_resolves_endpoints_from_the_home(weights_server: RunningServer, kafka_bootstrap: str,
                                              topics: Topics, tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_endpoints(home, StackEndpoints(
        supervisor_pid=os.getpid(), kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix,
        model="model-of-this-stack", grpc={"weights": f"127.0.0.1:{weights_server.port}", "extractor": "127.0.0.1:1"}))

    listed = _apprentice(home, "weights", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("only the base model model-of-this-stack;"), listed.stdout  # the recorded model
    st = _apprentice(home, "weights", "status")
    assert st.stdout.startswith("model model-of-this-stack: promoted"), st.stdout + st.stderr   # the recorded model

    # explicit settings win over the record
    flag = _apprentice(home, "weights", "list", "--endpoint", "127.0.0.1:1", "--timeout", "3")
    var = _apprentice(home, "weights", "list", "--timeout", "3", APPRENTICE_WEIGHTS_ENDPOINT="127.0.0.1:1")
    for proc in (flag, var):
        assert proc.returncode == 3 and "127.0.0.1:1 is not answering" in proc.stderr, proc.stderr

    # knowledge: no extractor answers at the recorded target, so it reads the recorded broker's topic
    kb = _apprentice(home, "knowledge", "list")
    assert "(no extractor at 127.0.0.1:1; reading the knowledge topic)" in kb.stderr, kb.stderr
    assert kb.returncode == 0 and "no knowledge bases" in kb.stdout, kb.stdout + kb.stderr
