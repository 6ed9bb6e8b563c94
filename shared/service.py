"""One service skeleton: the handle every service's core object exposes, and the run loop `__main__` drives.

Each `services/<name>/__main__.py` does the same four things, and only it does them: parse settings,
configure logging, build the service's handle, then `run_service(...)`, which owns the metrics
endpoint and the SIGTERM/SIGINT handling. The handle itself never installs signal handlers or starts
the metrics endpoint, so tests and the local stack can start any service in-process, several at once,
and stop it with `stop()`.

    handle = InferenceApp(settings)          # builds, binds nothing yet
    handle.start()                           # returns once it serves (ports bound, consumers joined)
    ...
    handle.stop(grace=5.0)                   # graceful, idempotent

The handles: inference `InferenceApp` (services/inference/service.py), weights `RunningServer`
(services/weights/service.py), extractor `ExtractorApp` (services/extractor/service.py), trainer `TrainerApp`
(services/trainer/service.py; torchrun's ranks > 0 run `loop.follower` instead, without metrics or signals
of their own), dashboard `DashboardServer` (services/dashboard/service.py; no metrics endpoint: port 0), grader
`GraderService` (services/grader/service.py). Each services/<name>/service.py holds its handle alone
(tests/unit/test_service_handles.py).

faust's Worker wants to own the event loop and the signals (asyncio installs loop signal handlers only
on the main thread). `GraderService` therefore runs the whole faust side, loop included, on a thread of
its own, with a Worker that installs no signal handlers; its `stop()` schedules on that loop what the
Worker's own SIGTERM handler would have done. `run_service` then drives it like any other handle.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Protocol, runtime_checkable

from shared.metrics import start_metrics_server

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


def run_service(handle: ServiceHandle, *, metrics_port: int, metrics_host: str = "127.0.0.1",
                grace: float | None = None, poll_s: float = 0.5) -> int:
    """Serve `handle` until SIGTERM/SIGINT or until it stops by itself; return its exit code.

    Order: signal handlers, then the metrics endpoint (`metrics_port` 0 = none; a taken port is a
    startup error, raised before anything else binds), then `handle.start()`.

    Signals: the first SIGTERM/SIGINT asks for a graceful stop; the handler only sets an event, and
    the stop itself runs on the main thread, outside the handler, so a slow graceful stop never runs
    inside a signal frame. One that arrives while the service is still starting (a model load, a topic
    rebuild) takes effect once `start()` returns: a start is never cut in the middle, so no half-built
    state is left to clean up. A second signal, at any time, ends the process at once (the default
    action is restored after the first), for the operator who will not wait; supervisors escalate to
    SIGKILL after their own grace anyway."""

    requested = threading.Event()

    received: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        # no logging here: the main thread may hold the logging lock the handler would wait for
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        received.append(signal.Signals(signum).name)
        requested.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    try:
        start_metrics_server(metrics_port, metrics_host)
        handle.start()
        try:
            while not requested.is_set():
                if handle.wait(poll_s):
                    break
            if received:
                log.info("stop requested (a second signal exits at once)", extra={"signal": received[0]})
        finally:
            handle.stop(grace)
        return handle.exit_code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


SIGNALS = (signal.SIGTERM, signal.SIGINT)
