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
        """Start serving; return once the service is ready. A start that cannot complete raises (a
        startup error of shared/startup.py, or any other) after stopping what it had started."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the service has stopped by itself (a fatal error, a drained input) or `timeout`
        passes; True when it has stopped."""

    def stop(self, grace: float | None = None) -> None:
        """Stop: finish or hand back in-flight work within `grace` seconds (None: the service's own
        setting); safe to call twice, and after a `start` that raised."""

    @property
    def exit_code(self) -> int:
        """The process's exit status once stopped: 0 after a requested stop, non-zero after a failure."""


class StartInterrupted(SystemExit):
    """Raised inside `handle.start()` by a SIGTERM/SIGINT that arrives while the service is starting (a
    model load, a topic rebuild can take minutes): the start unwinds through its own clean-up (`finally`,
    `except BaseException`) instead of finishing a start nobody wants. A SystemExit, so that the
    `except Exception` of code it passes through does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def run_service(handle: ServiceHandle, *, metrics_port: int, metrics_host: str = "127.0.0.1",
                grace: float | None = None, poll_s: float = 0.5) -> int:
    """Serve `handle` until SIGTERM/SIGINT or until it stops by itself; return its exit code.

    Order: signal handlers, then the metrics endpoint (`metrics_port` 0 = none; a taken port is a
    startup error, before anything else binds), then `handle.start()`. A signal during the start
    interrupts it (StartInterrupted; the exit status is then 128 + the signal, as a shell reports a
    process a signal ended) and a second one kills the process at once. After the start, the signal
    handler only sets an event: the stop itself runs on the main thread, outside the handler, so a slow
    graceful stop never runs inside a signal frame."""
    from shared.metrics import start_metrics_server

    requested = threading.Event()
    starting = True

    def on_signal(signum: int, _frame: object) -> None:
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        requested.set()
        if starting:
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            raise StartInterrupted(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    try:
        start_metrics_server(metrics_port, metrics_host)
        try:
            handle.start()
            starting = False
        except StartInterrupted as e:
            starting = False
            log.info("stopped while starting")
            handle.stop(grace)      # what the start left running (nothing, unless it had just returned)
            return e.code if isinstance(e.code, int) else 1
        try:
            while not requested.is_set():
                if handle.wait(poll_s):
                    break
        finally:
            handle.stop(grace)
        return handle.exit_code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


SIGNALS = (signal.SIGTERM, signal.SIGINT)
