"""shared/service.py's `run_service`: what it does with signals, with a handle that stops by itself, and
with the metrics port. The signal cases run in a real child process (signals go to a process, and
`run_service` installs its handlers on the main thread); the others run here, on pytest's main thread.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from shared.service import ServiceHandle, run_service

REPO = Path(__file__).resolve().parents[3]


class TrivialHandle:
    """A handle that does nothing but record what was asked of it; `fail_with` makes it stop by itself."""

    def __init__(self, fail_with: int | None = None, after_s: float = 0.2) -> None:
        self.calls: list[str] = []
        self._stopped = threading.Event()
        self._code = 0
        self._failer: threading.Thread | None = None
        if fail_with is not None:
            def fail() -> None:
                time.sleep(after_s)
                self._code = fail_with
                self._stopped.set()
            self._failer = threading.Thread(target=fail, daemon=True)

    def start(self) -> None:
        self.calls.append("start")
        if self._failer is not None:
            self._failer.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        self.calls.append(f"stop({grace})")
        self._stopped.set()

    @property
    def exit_code(self) -> int:
        return self._code


CHILD = textwrap.dedent("""
    import logging, signal, sys, threading, time
    from shared.service import run_service

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)

    class Handle:
        def __init__(self):
            self.stopped = threading.Event()
        def start(self):
            if sys.argv[1] in ("slow-start", "very-slow-start"):
                print("starting", flush=True)
                told = False
                steps = 20 if sys.argv[1] == "slow-start" else 600
                for _ in range(steps):       # a start is not cut: each step runs to its end
                    time.sleep(0.1)
                    if not told and signal.getsignal(signal.SIGINT) is signal.SIG_DFL:
                        print("default restored", flush=True)    # the first signal was handled
                        told = True
            print("started", flush=True)
        def wait(self, timeout=None):
            return self.stopped.wait(timeout)
        def stop(self, grace=None):
            print(f"stopped grace={grace}", flush=True)
            self.stopped.set()
        @property
        def exit_code(self):
            return 0

    sys.exit(run_service(Handle(), metrics_port=0, grace=1.5))
""")


def _child(mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", CHILD, mode], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _read_until(proc: subprocess.Popen[str], line: str, timeout: float = 60.0) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = proc.stdout.readline()
        if not out:
            break
        seen.append(out.rstrip("\n"))
        if seen[-1] == line:
            return seen
    proc.kill()
    raise AssertionError(f"never printed {line!r}; got {seen}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_handle_and_the_process_exits_0(sig: signal.Signals) -> None:
    proc = _child("normal")
    _read_until(proc, "started")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert out.splitlines().count("stopped grace=1.5") == 1, out   # stop() once, with run_service's grace


def test_a_signal_during_start_stops_the_service_once_it_has_started() -> None:
    proc = _child("slow-start")
    _read_until(proc, "starting")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert lines.index("started") < lines.index("stopped grace=1.5"), out


def test_a_second_signal_ends_the_process_at_once() -> None:
    proc = _child("very-slow-start")   # a minute of start: the second signal surely lands inside it
    _read_until(proc, "starting")
    proc.send_signal(signal.SIGINT)
    _read_until(proc, "default restored")     # the first signal handled while start() still runs
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, out  # killed by the signal: neither started nor stopped
    assert "started" not in out.splitlines() and "stopped grace=1.5" not in out, out


def test_a_handle_that_stops_by_itself_ends_run_service_with_its_exit_code() -> None:
    handle = TrivialHandle(fail_with=3)
    assert isinstance(handle, ServiceHandle)
    t0 = time.monotonic()
    assert run_service(handle, metrics_port=0, poll_s=0.05) == 3
    assert time.monotonic() - t0 < 5
    assert handle.calls == ["start", "stop(None)"]    # stopped once more, to release what it holds


def test_run_service_puts_the_previous_signal_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run_service(TrivialHandle(fail_with=0, after_s=0.0), metrics_port=0, poll_s=0.05)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _listening_ports() -> set[int]:
    """TCP ports this process listens on (its socket inodes matched with /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:       # 0A = LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


class ProbingHandle(TrivialHandle):
    """Looks at the process while it serves: which ports it listens on, what `probe` answers."""

    def __init__(self, probe: int | None = None) -> None:
        super().__init__(fail_with=0, after_s=0.0)
        self.probe = probe
        self.listening: set[int] = set()
        self.metrics = b""

    def start(self) -> None:
        self.listening = _listening_ports()
        if self.probe is not None:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe}/metrics", timeout=10) as r:
                self.metrics = r.read()
        super().start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_port_0_opens_no_endpoint_and_a_port_serves_metrics() -> None:
    before = _listening_ports()
    none = ProbingHandle()
    run_service(none, metrics_port=0, poll_s=0.05)
    assert none.listening == before                  # nothing new listens while the service runs

    port = _free_port()
    served = ProbingHandle(probe=port)
    run_service(served, metrics_port=port, poll_s=0.05)
    assert port in served.listening and b"# TYPE" in served.metrics   # the control: a real endpoint


def test_a_taken_metrics_port_is_a_startup_error_before_the_handle_starts() -> None:
    from shared.rpc.grpc_util import PortInUse

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        handle = TrivialHandle()
        with pytest.raises(PortInUse, match="metrics port"):
            run_service(handle, metrics_port=held.getsockname()[1])
    assert handle.calls == []
