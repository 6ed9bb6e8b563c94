"""The stack's recorded endpoints: written atomically, read back, stale records ignored, and applied to a
client's environment without overriding anything the user set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shared.contracts.stack_endpoints import (
    StackEndpoints,
    announce_endpoints,
    apply_stack_endpoints,
    endpoints_path,
    read_endpoints,
    remove_endpoints,
    state_home,
    write_endpoints,
)


def _endpoints(pid: int, **kw: object) -> StackEndpoints:
    base: dict[str, object] = dict(
        supervisor_pid=pid, kafka_bootstrap="127.0.0.1:19092", topic_prefix="run-x.", model="tiny-random",
        grpc={"inference": "127.0.0.1:40051", "weights": "127.0.0.1:40052", "extractor": "127.0.0.1:40053"},
        metrics={"inference": 40101}, http={"openai": 40080, "dashboard": 48080},
        tls_ca="/s/ca.pem", operator_token="/s/operator.token")
    base.update(kw)
    return StackEndpoints(**base)  # type: ignore[arg-type]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_round_trip_and_client_env(tmp_path: Path) -> None:
    ep = _endpoints(os.getpid())
    write_endpoints(tmp_path, ep)
    assert read_endpoints(tmp_path) == ep
    assert ep.client_env() == {
        "APPRENTICE_KAFKA_BOOTSTRAP": "127.0.0.1:19092", "APPRENTICE_TOPIC_PREFIX": "run-x.",
        "APPRENTICE_MODEL": "tiny-random", "APPRENTICE_WEIGHTS_ENDPOINT": "127.0.0.1:40052",
        "APPRENTICE_EXTRACTOR_ENDPOINT": "127.0.0.1:40053", "APPRENTICE_TARGET": "127.0.0.1:40051",
        "APPRENTICE_TLS_CA": "/s/ca.pem", "APPRENTICE_AUTH_TOKEN_FILE": "/s/operator.token"}


def test_explicit_variables_win(tmp_path: Path) -> None:
    write_endpoints(tmp_path, _endpoints(os.getpid()))
    env = {"APPRENTICE_WEIGHTS_ENDPOINT": "10.0.0.1:1", "APPRENTICE_TOPIC_PREFIX": "", "APPRENTICE_AUTH_TOKEN": "k"}
    assert apply_stack_endpoints(tmp_path, env) is not None
    assert env["APPRENTICE_WEIGHTS_ENDPOINT"] == "10.0.0.1:1"       # set by the user: kept
    assert env["APPRENTICE_TOPIC_PREFIX"] == ""                     # set, even empty: kept
    assert "APPRENTICE_AUTH_TOKEN_FILE" not in env                  # a key given inline: no token file added
    assert env["APPRENTICE_EXTRACTOR_ENDPOINT"] == "127.0.0.1:40053"  # unset: filled from the record
    assert env["APPRENTICE_KAFKA_BOOTSTRAP"] == "127.0.0.1:19092"


def test_a_deprecated_client_variable_the_user_set_wins_over_the_record(tmp_path: Path) -> None:
    write_endpoints(tmp_path, _endpoints(os.getpid()))
    env = {"APPRENTICE_EXTRACTOR_TARGET": "10.0.0.2:3"}
    apply_stack_endpoints(tmp_path, env)
    assert "APPRENTICE_EXTRACTOR_ENDPOINT" not in env          # the CLI then reads the old name (renamed_env)


def test_stale_missing_or_corrupt_records_are_ignored(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert apply_stack_endpoints(tmp_path, env) is None and env == {}           # no record
    write_endpoints(tmp_path, _endpoints(_dead_pid()))
    assert apply_stack_endpoints(tmp_path, env) is None and env == {}           # its supervisor is gone
    assert read_endpoints(tmp_path, live_only=False) is not None
    endpoints_path(tmp_path).write_text("{not json")
    assert read_endpoints(tmp_path, live_only=False) is None


def test_remove_only_our_own_record(tmp_path: Path) -> None:
    write_endpoints(tmp_path, _endpoints(os.getpid()))
    remove_endpoints(tmp_path, supervisor_pid=os.getpid() + 1)   # another stack's stop: not ours to remove
    assert endpoints_path(tmp_path).exists()
    remove_endpoints(tmp_path, supervisor_pid=os.getpid())
    assert not endpoints_path(tmp_path).exists()


def test_a_private_stack_is_announced_only_where_no_live_stack_is_recorded(tmp_path: Path) -> None:
    from dataclasses import replace

    from tools.stack.ports import Ports

    home, run = tmp_path / "home", tmp_path / "home" / "demo" / "run-1"
    demo = replace(_endpoints(os.getpid()), home=str(run))
    assert state_home(home) == home                                   # nothing recorded: the home itself
    assert announce_endpoints(home, demo) and read_endpoints(home) == demo
    assert state_home(home) == run                                    # status reads the run's stack.json
    ports = Ports.from_endpoints(demo)
    assert (ports.inference, ports.weights, ports.extractor, ports.http, ports.dashboard) == (
        40051, 40052, 40053, 40080, 48080)
    assert ports.metrics["inference"] == 40101 and ports.metrics["grader"] == 0
    assert Ports.from_endpoints(replace(demo, grpc={"inference": "unix:/run/x", "weights": "host"})).inference == 0
    up = _endpoints(os.getpid(), topic_prefix="")                    # `apprentice up`'s own, live record
    write_endpoints(home, up)
    assert not announce_endpoints(home, demo) and read_endpoints(home) == up   # never over a live stack
    write_endpoints(home, _endpoints(_dead_pid()))
    assert announce_endpoints(home, demo)                             # a stale record is replaced


def test_malformed_or_writable_by_others_records_are_ignored(tmp_path: Path) -> None:
    """A record is read by every CLI command: a broken or planted one is ignored, never a crash."""
    import json

    good = _endpoints(os.getpid()).as_dict()
    bad = [{**good, "supervisor_pid": 10 ** 30}, {**good, "supervisor_pid": 0}, {**good, "supervisor_pid": True},
           {**good, "grpc": [1]}, {**good, "metrics": {"inference": "Infinity"}},
           {**good, "http": {"openai": 70000}}, {**good, "operator_token": 7}, {**good, "kafka_bootstrap": None},
           [], "text", {"supervisor_pid": os.getpid()}]
    for record in bad:
        endpoints_path(tmp_path).write_text(json.dumps(record))
        assert read_endpoints(tmp_path, live_only=False) is None, record
    endpoints_path(tmp_path).write_text('{"metrics": {"inference": Infinity}, "supervisor_pid": 1}')
    assert read_endpoints(tmp_path, live_only=False) is None
    write_endpoints(tmp_path, _endpoints(os.getpid()))
    assert read_endpoints(tmp_path) is not None
    endpoints_path(tmp_path).chmod(0o666)                # anyone may write it: it may not steer this process
    assert read_endpoints(tmp_path) is None
