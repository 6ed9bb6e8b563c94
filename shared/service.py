"""One service skeleton: the handle every service's core object exposes, and the run loop `__main__` drives.

Each `services/<name>/__main__.py` does the same four things, and only it does them: parse settings,
configure logging, build the service's handle, then `run_service(...)`, which owns the metrics
endpoint and the SIGTERM/SIGINT handling. The handle itself never installs signal handlers or starts
the metrics endpoint, so tests and the local stack can start any service in-process, several at once,
and stop it with `stop()`.

    handle = InferenceService(settings)      # builds, binds nothing yet
    handle.start()                           # returns once it serves (ports bound, consumers joined)
    ...
    handle.stop(grace=5.0)                   # graceful, idempotent
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class ServiceHandle(Protocol):
    """What `run_service` (and a test) needs from a service."""

    def start(self) -> None:
        """Start serving; return once the service is ready (raises a startup error if it cannot start)."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the service has stopped by itself (a fatal error, a drained input) or `timeout`
        passes; True when it has stopped."""

    def stop(self, grace: float | None = None) -> None:
        """Stop: finish or hand back in-flight work within `grace` seconds; safe to call twice."""

    @property
    def exit_code(self) -> int:
        """The process's exit status once stopped: 0 after a requested stop, non-zero after a failure."""


def run_service(handle: ServiceHandle, *, metrics_port: int, metrics_host: str = "127.0.0.1",
                grace: float | None = None, poll_s: float = 0.5) -> int:
    """Serve `handle` until SIGTERM/SIGINT or until it stops by itself; return its exit code.

    The signal handler only sets an event: the stop itself runs on the main thread, outside the
    handler, so a slow graceful stop never runs inside a signal frame."""
    from shared.metrics import start_metrics_server

    requested = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    start_metrics_server(metrics_port, metrics_host)
    handle.start()
    try:
        while not requested.is_set():
            if handle.wait(poll_s):
                break
    finally:
        handle.stop(grace)
    return handle.exit_code
