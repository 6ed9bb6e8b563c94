"""Faults for chaos runs (`chaos.py`): killing the private broker (`kafka.private_broker`) and starting it
again, kill -9 of supervised services with the wait for their restart, operator weight swaps through the
Weights service.

Each fault returns a `Window` (wall clock, like the load generator's call records), so failed calls can
be attributed to what was broken at the time (`chaos_invariants.classify`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.chaos_invariants import Window
from tools.broker.cluster import LocalCluster
from tools.broker.local_broker import LocalBroker
from tools.stack.probe import metrics_text
from tools.stack.stack import LocalStack


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _reap(pid: int, timeout: float) -> bool:
    """Wait for our child `pid` to exit and collect it (a zombie would still answer `kill(pid, 0)`,
    which LocalBroker takes for a running broker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:           # already collected (subprocess's own clean-up)
            return True
        if done:
            return True
        time.sleep(0.1)
    return False


def broker_down(broker: LocalBroker, how: str) -> None:
    pid = broker.status().pid
    if pid is None:
        raise RuntimeError("the private broker is not running")
    if how == "kill":
        os.kill(pid, signal.SIGKILL)
        _reap(pid, 30)
    else:
        os.kill(pid, signal.SIGTERM)
        if not _reap(pid, 60):
            os.kill(pid, signal.SIGKILL)
            _reap(pid, 30)
    broker.pid_file.unlink(missing_ok=True)


def stop_broker(broker: LocalBroker) -> None:
    with contextlib.suppress(RuntimeError, ProcessLookupError):
        broker_down(broker, "stop")


# --- faults ------------------------------------------------------------------------------------------
def kill_group(stack: LocalStack, names: tuple[str, ...], timeout: float) -> dict[str, tuple[Window, bool]]:
    """kill -9 the services `names` at the same moment; each one's window lasts until the supervisor
    restarted it and it answers again. Returns name -> (window, came back within `timeout`)."""
    t0 = time.time()
    pids = {n: stack.supervisor.kill(n) for n in names}
    out: dict[str, tuple[Window, bool]] = {}
    for n, pid in pids.items():
        if pid is None:
            say(f"{n}: not running, nothing to kill")
            out[n] = (Window("kill", n, t0, t0), False)
    pending = {n for n, pid in pids.items() if pid is not None}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        health = stack.health()
        for n in sorted(pending):
            proc = stack.supervisor.child(n).proc
            if proc is not None and proc.pid != pids[n] and proc.poll() is None and health[n]:
                out[n] = (Window("kill", n, t0, time.time()), True)
                pending.discard(n)
                say(f"{n}: kill -9 pid {pids[n]}; restarted as pid {proc.pid}, healthy after {time.time() - t0:.1f}s")
        time.sleep(0.3)
    for n in pending:
        c = stack.supervisor.child(n)
        say(f"{n}: NOT healthy again {timeout:.0f}s after kill -9 (exits {c.exits[-3:]}); see {c.log_path}")
        out[n] = (Window("kill", n, t0, time.time()), False)
    return out


def broker_outage(broker: LocalBroker, how: str, down_s: float) -> Window:
    """Take the private broker down (SIGKILL or SIGTERM), keep it down `down_s`, start it again on the
    same port and data; the window lasts until it answers metadata requests again."""
    t0 = time.time()
    broker_down(broker, how)
    time.sleep(down_s)          # the outage itself: clients and services see the broker gone this long
    broker.start(timeout=180)
    w = Window("broker", "broker", t0, time.time())
    say(f"broker: {'kill -9' if how == 'kill' else 'clean stop'}, down {down_s:.0f}s, answering again after "
        f"{w.end - t0:.1f}s")
    return w


def upload_operator_version(stack: LocalStack, model: str, work: Path) -> str | None:
    """Upload a copy of the base weights as an operator version (every tenant), a CANDIDATE; None when the
    model has no local full-weights folder to copy."""

    from shared.models import resolve_model_dir
    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
    from shared.weights.client import upload_version

    src = resolve_model_dir(model)
    if not isinstance(src, Path) or not (src / "model.safetensors").exists():
        return None
    work.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        shutil.copy(src / name, work / name)
    with stack.channel(stack.weights_target) as ch:
        m = upload_version(weights_pb2_grpc.WeightsStub(ch), weights_pb2.UploadHeader(
            model=model, kind="full", base_model=model, tenant="", parent_version="base",
            training_metadata={"source": "chaos operator swap"}), work, timeout=120)
    return str(m.version)


def operator_version(stack: LocalStack, model: str, work: Path) -> str | None:
    """Upload a copy of the base weights as an operator version and promote it past the gate."""

    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc

    version = upload_operator_version(stack, model, work)
    if version is not None:
        with stack.channel(stack.weights_target) as ch:
            weights_pb2_grpc.WeightsStub(ch).Promote(weights_pb2.PromoteRequest(
                model=model, version=version, force=True, reason="chaos: operator swap under load"), timeout=60)
    return version


@dataclass
class PromotionFault:
    """A weights replica killed while it gated a promotion: which, when, and how the promotion ended."""
    window: Window
    version: str
    in_flight: bool
    """The Promote call was waiting on the killed replica when it died, and failed with it."""
    promoted: bool
    """The caller's retry (on the surviving replica) promoted the version."""
    promote_seconds: float
    restarted: bool = False
    """The killed replica was restarted by the supervisor and answered again."""


def promotion_outage(stack: LocalStack, model: str, version: str, timeout: float) -> PromotionFault:
    """An operator's client promotes `version` through the gate on the first weights replica (its connection
    is there, as a client's is on one pod behind a Service); that replica is kill -9'd as soon as its gate
    runs (`apprentice_weights_evaluations_running`: this promotion's, or a trainer version's ahead of it
    in the gate's queue), and the client retries over every replica, as it would through the Service. The
    window lasts until the killed replica is restarted and answers again."""

    import grpc

    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc

    acked: list[object] = []
    errors: list[str] = []
    took: list[float] = []
    first, victim = f"127.0.0.1:{stack.ports.weights}", "weights"

    def promote() -> None:
        t0 = time.monotonic()
        request = weights_pb2.PromoteRequest(model=model, version=version, reason="chaos: promotion under a kill")
        target = first
        while not acked and time.monotonic() - t0 < timeout:
            with stack.channel(target) as ch:
                try:
                    acked.append(weights_pb2_grpc.WeightsStub(ch).Promote(request, timeout=timeout,
                                                                         wait_for_ready=target != first))
                except grpc.RpcError as e:
                    errors.append(e.code().name)
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                        break
                    target = stack.weights_target       # the retry goes to whichever replica answers
                    time.sleep(0.2)
        took.append(time.monotonic() - t0)

    caller = threading.Thread(target=promote, daemon=True)
    caller.start()
    running, deadline = False, time.monotonic() + timeout
    while not running and caller.is_alive() and time.monotonic() < deadline:
        running = "apprentice_weights_evaluations_running 1.0" in (metrics_text(stack.ports.metrics["weights"]) or "")
        if not running:
            time.sleep(0.02)       # the gate of a tiny model takes about a second: poll well inside it
    in_flight = running and caller.is_alive()
    if not running:
        say("weights: the promotion finished before the replica's gate was seen running; nothing killed")
        caller.join(timeout)
        t = time.time()
        return PromotionFault(Window("kill", victim, t, t), version, False, bool(acked), sum(took))
    window, back = kill_group(stack, (victim,), timeout)[victim]
    caller.join(timeout)
    say(f"weights: kill -9 of {victim} while its gate ran and the promotion of {version} waited on it; the "
        f"caller's retries ({errors}) {'promoted it' if acked else 'did not promote it'} after {sum(took):.1f}s")
    return PromotionFault(window, version, in_flight and bool(errors), bool(acked), sum(took), back)


def rollback_to_base(stack: LocalStack, model: str) -> None:

    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc

    with stack.channel(stack.weights_target) as ch:
        weights_pb2_grpc.WeightsStub(ch).Rollback(weights_pb2.RollbackRequest(
            model=model, version="base", tenant="", reason="chaos: operator rollback under load"), timeout=60)


# --- faults of a replicated cluster (ChaosConfig.brokers = 3) ------------------------------------------------
def leader_outage(cluster: LocalCluster, topics: list[str], down_s: float) -> Window:
    """kill -9 the node that leads the most partitions of `topics`, keep it down `down_s`, start it again; the
    window lasts until it answers and every partition is back in sync (the cluster itself keeps serving)."""
    victim = cluster.busiest_leader(topics)
    t0 = time.time()
    cluster.node(victim).kill()
    say(f"cluster: kill -9 node {victim} (leads the most partitions of {', '.join(topics)})")
    time.sleep(down_s)
    cluster.restart(victim)
    synced = cluster.wait_in_sync()
    w = Window("broker", f"node-{victim}", t0, time.time())
    say(f"cluster: node {victim} back and every partition in sync {w.end - t0:.1f}s after its kill "
        f"(in sync {synced:.1f}s after it answered)")
    return w


def rolling_restart(cluster: LocalCluster) -> Window:
    """Restart every node in turn (clean stop, start, wait until it answers and every partition is in sync)."""
    t0 = time.time()
    for node in cluster.nodes:
        cluster.restart(node.node_id)
        cluster.wait_in_sync()
        say(f"cluster: node {node.node_id} restarted and in sync after {time.time() - t0:.1f}s")
    return Window("rolling", "cluster", t0, time.time())
