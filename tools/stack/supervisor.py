"""Service specs --> running, supervised processes (the local stack behind `apprentice up`).

Each service runs as `python -m tools.cli.main serve NAME` with its log under `.apprentice/logs/`. A
crashed service is restarted with exponential back-off (1 s doubling to 30 s, reset after a minute of
uptime), so one bad start does not spin the CPU and a transient failure heals by itself.

A child is one pod: a replica of a service is a child of its own named `SERVICE-N` (`inference-1`), and
the trainer may run as several torchrun ranks in one child (`ranks`). A kill -9 takes the whole pod (its
process group and every process below it: torchrun's agent and its ranks together), as losing a container
does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.contracts.stack_endpoints import StackEndpoints, remove_endpoints, write_endpoints
from shared.logs import configure_logging
from shared.retry import Backoff
from shared.settings import CommonSettings
from tools.broker.local_broker import local_credentials_dir, principal_env
from tools.devca import DevCredentials, ensure_dev_credentials
from tools.record_keys import ensure as ensure_record_keys
from tools.stack.ports import Ports, wire_services

log = logging.getLogger(__name__)

SERVICES = ("weights", "inference", "grader", "extractor", "trainer", "dashboard")
BACKOFF_START_S, BACKOFF_MAX_S, HEALTHY_AFTER_S = 1.0, 30.0, 60.0


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    started_wall: float = 0.0          # wall clock of the last start (status, chaos timelines)
    restarts: int = 0
    backoff: Backoff = field(default_factory=lambda: Backoff(BACKOFF_START_S, BACKOFF_MAX_S, jitter=False))
    next_start: float = 0.0
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:  # the child keeps its own copy; ours closes (no fd per restart)
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        self.started_at = time.monotonic()
        self.started_wall = time.time()

    def poll(self, now: float) -> None:
        """Restart a dead child once its back-off has passed."""
        if self.proc is not None and self.proc.poll() is None:
            if now - self.started_at > HEALTHY_AFTER_S:
                self.backoff.reset()
            return
        if self.proc is not None:
            code = self.proc.returncode
            self.exits.append(code)
            delay = self.backoff.next()
            log.warning("service exited", extra={"service": self.name, "code": code, "restart_in_s": delay})
            self.proc = None
            self.next_start = now + delay
            return
        if now >= self.next_start:
            self.restarts += 1 if self.started_at else 0
            self.start()

    def stop(self, grace: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill_pod(self.proc.pid, signal.SIGKILL)    # the pod: torchrun's ranks go with their agent
            self.proc.wait(5)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; [] elsewhere). torchrun starts each rank in a session of its
    own, so a kill of the agent's process group would leave the ranks running, holding the trainer's ports
    and Kafka group: a pod's kill must reach them by parentage."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue                       # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_pod(pid: int, sig: int) -> None:
    """`sig` to the process group of `pid` and to every process below it (the whole pod, as a container's end)."""
    below = descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    for p in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def service_of(child: str) -> str:
    """The service a child runs: `inference-1` is a replica of `inference`."""
    return child.split("-", 1)[0]


def child_argv(child: str, ranks: int = 1) -> list[str]:
    """How a child starts: `serve SERVICE`, under torchrun (one node, `ranks` processes on a free rendezvous
    port) when the service trains on several ranks."""
    serve = ["-m", "tools.cli.main", "serve", service_of(child)]
    if ranks <= 1:
        return [sys.executable, *serve]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc_per_node={ranks}", *serve]


class Supervisor:
    def __init__(self, home: Path, services: tuple[str, ...] = SERVICES, env: dict[str, str] | None = None,
                 service_env: dict[str, dict[str, str]] | None = None,
                 extra_state: dict[str, Any] | None = None, ranks: dict[str, int] | None = None) -> None:
        """`services` names the children (a service, or a replica `SERVICE-N`); `service_env` is keyed by
        child. `ranks`: torchrun processes per child (the trainer's data-parallel ranks). `extra_state` goes
        into `stack.json` as is (`apprentice up` records the ports there, so that `apprentice status` in
        another shell probes the right ones)."""
        self.home = home
        self.state_file = home / "stack.json"
        self.extra_state = extra_state or {}
        base_env = dict(os.environ if env is None else env)
        self.children = [Child(name, child_argv(name, (ranks or {}).get(name, 1)),
                               home / "logs" / f"{name}.log", {**base_env, **(service_env or {}).get(name, {})})
                         for name in services]
        self._stopping = False
        self._thread: threading.Thread | None = None

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int | None:
        """Send `sig` to a running child's process group, i.e. the whole pod (chaos tests: kill -9, then watch
        the restart); its pid or None."""
        proc = self.child(name).proc
        if proc is None or proc.poll() is not None:
            return None
        kill_pod(proc.pid, sig)
        return proc.pid

    def start_background(self, poll_s: float = 0.5) -> None:
        """Supervise from a thread (for callers that own the main thread and its signals, like the demo)."""
        def loop() -> None:
            while not self._stopping:
                now = time.monotonic()
                for c in self.children:
                    c.poll(now)
                self.write_state()
                time.sleep(poll_s)
        self._thread = threading.Thread(target=loop, name="supervisor", daemon=True)
        self._thread.start()

    def write_state(self) -> None:
        state = {"supervisor_pid": os.getpid(), "updated": time.time(), **self.extra_state,
                 "services": {c.name: {"pid": c.proc.pid if c.proc and c.proc.poll() is None else None,
                                       "restarts": c.restarts, "exits": c.exits[-5:], "started_at": c.started_wall,
                                       "log": str(c.log_path)}
                              for c in self.children}}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    def run(self, poll_s: float = 0.5) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stopping", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "_stopping", True))
        try:
            while not self._stopping:
                now = time.monotonic()
                for c in self.children:
                    c.poll(now)
                self.write_state()
                time.sleep(poll_s)
        finally:
            self.stop()

    def stop(self, grace: float = 20.0) -> None:
        self._stopping = True
        if self._thread is not None:
            self._thread.join(5)
        # Reverse start order: producers of traffic stop before the services they feed.
        for c in reversed(self.children):
            c.stop(grace)
        self.state_file.unlink(missing_ok=True)


def main() -> int:
    settings = CommonSettings()
    configure_logging("supervisor", settings.log_level, settings.log_json)
    services = tuple(os.environ.get("APPRENTICE_STACK_SERVICES", ",".join(SERVICES)).split(","))
    ports = Ports.configured()
    # the wiring fills in what the user did not set (an endpoint set in the environment wins)
    wiring = {name: {k: v for k, v in env.items() if k not in os.environ}
              for name, env in wire_services(ports, bind_host=None).items()}
    secure_dev = not (os.environ.get("APPRENTICE_AUTH_KEYS") or os.environ.get("APPRENTICE_AUTH_KEYS_FILE"))
    if secure_dev:
        # No keys of the user's own: the local stack runs with its development CA and keys (SECURITY.md).
        creds = ensure_dev_credentials(settings.home)
        # The CLI that started us may carry the stack's operator key as a client: services get the service key.
        inherited = {k: v for k, v in os.environ.items()
                     if not (k == "APPRENTICE_AUTH_TOKEN_FILE" and v == str(creds.operator_token))}
        secure = {k: v for k, v in creds.service_env().items() if k not in inherited}
        for env in wiring.values():
            env.update(secure)
        # the dashboard reads every tenant's data as the operator (its users sign in with operator keys)
        if "APPRENTICE_DASHBOARD_OPERATOR_TOKEN_FILE" not in os.environ:
            wiring["dashboard"]["APPRENTICE_DASHBOARD_OPERATOR_TOKEN_FILE"] = str(creds.operator_token)

    sasl_dir = local_credentials_dir(os.environ)
    if sasl_dir is not None:
        # the local broker's credentials (`apprentice up` holds the operator's): each service gets its own
        # principal's instead, and with it exactly the rights of the access table (SECURITY.md §4)
        for name, env in wiring.items():
            env.update(principal_env(sasl_dir, name))
    elif settings.record_signatures == "required" and settings.record_keys_dir is None:
        # a broker of the user's own: no local broker wrote the record-signing keys, so the stack's home gets
        # them here (a directory the user names in APPRENTICE_RECORD_KEYS_DIR is theirs: a missing key there
        # stops the service with one line, shared/startup.py)
        ensure_record_keys(settings.record_keys_path())

    dev = DevCredentials(settings.home / "secrets") if secure_dev else None
    write_endpoints(settings.home, stack_endpoints(
        ports, settings, ca=dev.ca if dev else settings.tls_ca, operator_token=dev.operator_token if dev else None))
    try:
        Supervisor(settings.home, services, service_env=wiring,
                   extra_state={"ports": ports.as_dict(), "model": settings.model}).run()
    finally:
        remove_endpoints(settings.home, os.getpid())
    return 0


def stack_endpoints(ports: Ports, settings: CommonSettings, *, ca: Path | None,
                    operator_token: Path | None) -> StackEndpoints:
    """What a stack bound to `ports` (tools.stack.stack.Ports) with `settings` (CommonSettings) offers
    its clients, as `shared.contracts.stack_endpoints` records it: `ca` signs its servers' certificates,
    `operator_token` holds its operator key (its development credentials; None with the user's own)."""

    d = ports.as_dict()
    http = {"openai": d.get("http", 0), "dashboard": d.get("dashboard", 0)}  # `dashboard`: when Ports has one
    return StackEndpoints(
        supervisor_pid=os.getpid(), kafka_bootstrap=settings.kafka_bootstrap, topic_prefix=settings.topic_prefix,
        model=settings.model, grpc={n: f"127.0.0.1:{d[n]}" for n in ("inference", "weights", "extractor")},
        metrics=dict(d["metrics"]), http={k: int(v) for k, v in http.items() if v},
        tls_ca=str(ca) if ca is not None and ca.exists() else None,
        operator_token=str(operator_token) if operator_token is not None and operator_token.exists() else None)


if __name__ == "__main__":
    sys.exit(main())
