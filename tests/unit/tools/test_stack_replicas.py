"""A replicated local stack (`LocalStack(replicas=..., trainer_ranks=...)`): each replica is a child of its
own on its own ports, its callers dial every replica through one address list, and the trainer runs as
torchrun ranks. Nothing is started here; tests/integration/test_loop_chaos.py runs such a stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.stack.stack import LocalStack


@pytest.fixture
def stack(tmp_path: Path) -> LocalStack:
    return LocalStack(tmp_path / "run", "tiny-random", secure=False,
                      replicas={"inference": 2, "grader": 2, "weights": 2}, trainer_ranks=2)


def env(stack: LocalStack, child: str) -> dict[str, str]:
    return stack.supervisor.child(child).env


def test_each_replica_is_a_child_on_its_own_ports(stack: LocalStack) -> None:
    assert [c.name for c in stack.supervisor.children] == [
        "weights", "weights-1", "inference", "inference-1", "grader", "grader-1", "extractor", "trainer", "dashboard"]
    for key in ("APPRENTICE_INFERENCE_PORT", "APPRENTICE_INFERENCE_HTTP_PORT", "APPRENTICE_INFERENCE_METRICS_PORT"):
        assert env(stack, "inference")[key] != env(stack, "inference-1")[key], key
    assert (env(stack, "inference")["APPRENTICE_INFERENCE_POD_ID"], env(stack, "inference-1")["APPRENTICE_INFERENCE_POD_ID"]) == (
        "pod-0", "pod-1")
    assert env(stack, "weights")["APPRENTICE_WEIGHTS_PORT"] != env(stack, "weights-1")["APPRENTICE_WEIGHTS_PORT"]
    assert env(stack, "weights")["APPRENTICE_HOME"] == env(stack, "weights-1")["APPRENTICE_HOME"]   # one store
    assert env(stack, "grader-1")["APPRENTICE_GRADER_WORKDIR"] != env(stack, "grader").get("APPRENTICE_GRADER_WORKDIR")
    assert stack.supervisor.child("inference-1").argv[-2:] == ["serve", "inference"]


def test_callers_dial_every_replica(stack: LocalStack) -> None:
    weights = [f"127.0.0.1:{stack.ports.weights}", f"127.0.0.1:{stack.replica_ports['weights-1'].weights}"]
    assert stack.weights_target == "ipv4:" + ",".join(weights)
    for child, key in (("trainer", "APPRENTICE_TRAINER_WEIGHTS_ENDPOINT"), ("inference", "APPRENTICE_INFERENCE_WEIGHTS_ENDPOINT"),
                       ("inference-1", "APPRENTICE_INFERENCE_WEIGHTS_ENDPOINT"), ("extractor", "APPRENTICE_EXTRACTOR_WEIGHTS_ENDPOINT")):
        assert env(stack, child)[key] == stack.weights_target, child
    assert env(stack, "grader-1")["APPRENTICE_GRADER_INFERENCE_ENDPOINT"] == stack.inference_target
    assert stack.inference_target.count(",") == 1


def test_the_trainer_runs_as_torchrun_ranks(stack: LocalStack) -> None:
    argv = stack.supervisor.child("trainer").argv
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node=2" in argv
    assert argv[-4:] == ["-m", "tools.cli.main", "serve", "trainer"]


def test_a_service_that_is_not_replicated_here_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="extractor"):
        LocalStack(tmp_path / "run", "tiny-random", secure=False, replicas={"extractor": 2})


def test_a_pods_kill_reaches_processes_in_sessions_of_their_own(tmp_path: Path) -> None:
    """torchrun starts each rank with a session of its own: killing the agent's process group alone would
    leave them running. `kill_pod` follows parentage."""
    import signal
    import subprocess
    import sys
    import time

    from tools.stack.supervisor import descendants, kill_pod

    spawn = ("import subprocess, sys, time; "
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
             "time.sleep(60)")
    agent = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not descendants(agent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (rank,) = descendants(agent.pid)
        kill_pod(agent.pid, signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 10
        while not gone(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(rank)
    finally:
        agent.kill()


def gone(pid: int) -> bool:
    """No such process, or a zombie (killed, waiting for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
