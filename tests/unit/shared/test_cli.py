"""The `apprentice` command line as a user runs it (real processes): `--version`; `--help` on every command
prints help and exits 0 at once without side effects (no file written, no port bound, no service
started); mistakes a user makes end in one clear line and a non-zero status, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from shared.models import KNOWN_MODELS, UnknownModel, check_model_name
from tools.cli import main as cli_main

REPO = Path(__file__).resolve().parents[3]
# every command the entry point knows (a new one is covered without editing this list), and some sub-commands
HELP_COMMANDS = [["kafka"], ["topics"], ["tail"], ["serve"], *(["serve", s] for s in cli_main.SERVICES),
                 *([c] for c in cli_main.DELEGATED), ["weights", "list"], ["weights", "promote"],
                 ["knowledge", "show"]]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port this test holds: a command that tried to serve on it would fail, not exit 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _env(home: Path, port: int | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
    env.update(APPRENTICE_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    if port is not None:
        for svc in cli_main.SERVICES:
            env[f"APPRENTICE_{svc.upper()}_METRICS_PORT"] = str(port)
            env[f"APPRENTICE_{svc.upper()}_PORT"] = str(port)
        env.update(APPRENTICE_INFERENCE_HTTP_PORT=str(port), APPRENTICE_EXTRACTOR_PORT=str(port),
                   APPRENTICE_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}")
    return env


def _apprentice(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_version(tmp_path: Path) -> None:
    proc = _apprentice(["--version"], _env(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == f"apprentice {version('apprentice')}"


def test_help_everywhere_without_side_effects(tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home, taken_port)
    for k in [k for k in os.environ if k.startswith("APPRENTICE_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    failures = []
    t0 = time.monotonic()
    # `serve NAME` as real processes: one that ignored --help would start a service (and be killed here)
    procs = [(cmd, subprocess.Popen([sys.executable, "-m", "tools.cli.main", *cmd, "--help"], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for cmd in HELP_COMMANDS if cmd[0] == "serve"]
    for cmd in (c for c in HELP_COMMANDS if c[0] != "serve"):
        with pytest.raises(SystemExit) as exit_:
            cli_main.main([*cmd, "--help"])
        out, err = capsys.readouterr()
        if exit_.value.code not in (0, None) or not out.startswith(f"usage: apprentice {' '.join(cmd)}") or err:
            failures.append(f"{' '.join(cmd)} --help: exit {exit_.value.code}, stdout {out[:80]!r}, stderr {err!r}")
    for cmd, p in procs:
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            failures.append(f"{' '.join(cmd)} --help did not exit (it started something)")
            continue
        usage = out.split("\n", 1)[0]
        if p.returncode != 0 or not usage.startswith("usage: apprentice ") or cmd[-1] not in usage or err:
            failures.append(f"{' '.join(cmd)} --help: rc {p.returncode}, stdout {out[:80]!r}, stderr {err[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert list(home.iterdir()) == []                       # nothing written: no logs, keys, broker data
    assert time.monotonic() - t0 < 50                       # a service that started would take far longer


def test_unknown_model_is_one_line_listing_the_known_ones(tmp_path: Path) -> None:
    proc = _apprentice(["demo", "--model", "no-such-model", "--quick"], _env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "unknown model 'no-such-model'" in lines[0] and all(m in lines[0] for m in KNOWN_MODELS)
    assert "path of a local model directory" in lines[0]
    assert not (tmp_path / "demo").exists()                 # refused before any run folder or stack


def test_up_refuses_an_unknown_model_before_starting_anything(tmp_path: Path) -> None:
    proc = _apprentice(["up"], {**_env(tmp_path), "APPRENTICE_MODEL": "no-such-model"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("apprentice up: unknown model 'no-such-model'")
    assert list(tmp_path.iterdir()) == []                   # no broker, keys, logs or supervisor


def test_check_model_name(tmp_path: Path) -> None:
    for name in KNOWN_MODELS:
        check_model_name(name)
    with pytest.raises(UnknownModel, match="has no config.json"):
        check_model_name(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    check_model_name(str(tmp_path))                          # a local model directory
    with pytest.raises(UnknownModel, match="unknown model 'some-org/not-cached-anywhere'"):
        check_model_name("some-org/not-cached-anywhere")     # offline: never a download attempt


def test_malformed_task_file_is_one_line_with_its_position(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nfacts:\n  - id: a\n    fact: x\n    answer_check: {type: contains, value: x\n")
    proc = _apprentice(["demo", "--task", str(bad), "--quick"], _env(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"apprentice demo: {bad}:6:1: YAML syntax error: expected ',' or '}}', but got '<stream end>' "
        "(while parsing a flow mapping)"]


def test_unreachable_broker_is_one_line_not_a_flood(tmp_path: Path) -> None:
    """A consumer, a producer and an admin client against a closed port for 4 s: librdkafka would write a
    line per reconnect attempt per client; the process writes one clear line (repeated every 30 s)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])                       # closed once the block ends: nothing listens
    script = f"""
import time
from shared.kafka.admin import admin
from shared.kafka.consumer import EventConsumer
from shared.kafka.producer import EventProducer
from shared.logs import configure_logging
configure_logging("probe", "INFO", True)
c = EventConsumer("127.0.0.1:{port}", "probe-group", ["probe-topic"])
p = EventProducer("127.0.0.1:{port}")
a = admin("127.0.0.1:{port}")
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    c.poll_batch(timeout=0.3)
    p.poll(0.1)
    a.poll(0.1)
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"Kafka broker unreachable at 127.0.0.1:{port} (" in lines[0] and lines[0].startswith("{")
    # the CLI's own consumer: a plain line on the terminal, the command still exits
    tail = _apprentice(["tail", "interactions", "--timeout", "2"],
                       _env(tmp_path, APPRENTICE_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}"))
    assert tail.stderr.strip().splitlines() == [line for line in tail.stderr.strip().splitlines()
                                                if line.startswith(f"Kafka broker unreachable at 127.0.0.1:{port}")]
    assert len(tail.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_tail_shows_each_records_signature_verdict(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`apprentice tail` names who signed each record, or why a consumer refuses it (issue #33 item 2):
    the operator looking at a topic sees a forged record for what it is."""
    import json
    import uuid

    from shared.contracts.topics import Topics
    from shared.kafka.admin import ensure_topics
    from shared.kafka.producer import EventProducer
    from tests.helpers.signing import signed_producer
    from tests.unit.trainer.factories import graded
    from tools.broker.cli import tail

    topics = Topics(prefix=f"test-tail-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, topics)
    for p in (signed_producer(kafka_bootstrap, "grader"), EventProducer(kafka_bootstrap, client_id="attacker"),
              signed_producer(kafka_bootstrap, "inference")):
        p.produce(topics.graded, "same-key", graded(f"i-{p.signer.principal if p.signer else 'none'}"))
        p.flush()
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", topics.prefix)
    capsys.readouterr()
    assert tail(["graded", "--from-beginning", "--max", "3", "--timeout", "20"]) == 0
    verdicts = [json.loads(line)["signature"] for line in capsys.readouterr().out.splitlines()]
    print(verdicts)
    assert verdicts == [{"signer": "grader"}, {"refused": "unsigned"},
                        {"refused": "signer inference may not write apprentice.graded.v1"}]
