"""The grader's service handle (shared/service.py `ServiceHandle`): the GraderApp of stream/app.py, run by a
faust Worker on a thread of its own.

A faust Worker (mode's) expects to own the process: `execute_from_commandline` runs its event loop until
the worker stops, and installs SIGINT/SIGTERM handlers on that loop, which asyncio only allows on the
main thread. Here `run_service` owns the signals, as for every service, so:

- the Worker subclass installs no signal handlers;
- everything faust (a new event loop, the GraderApp whose faust.App takes the loop it is built on, the
  Worker) is built and run on the handle's thread, so the main thread stays free for `run_service`;
- `stop()` asks the worker to stop exactly as its own SIGTERM handler would (scheduled on its loop,
  thread-safely) and waits for the thread: faust's own shutdown (commits, tables) runs unchanged.

`wait` ends when the worker stops by itself (a crash inside faust); the exit code is the one faust's
`execute_from_commandline` exits with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import faust

from services.grader.core.rulebook import RuleBook
from services.grader.settings import GraderSettings
from services.grader.stream.app import SOURCE, GraderApp
from services.grader.stream.internal_topics import ensure_internal_topics
from services.grader.stream.rules_follower import follow
from shared.grading import GraderConfig
from shared.kafka.trust import record_signer
from shared.startup import kafka_refusal

log = logging.getLogger(__name__)


class _Worker(faust.Worker):
    def install_signal_handlers(self) -> None:
        """None: the process's signals belong to run_service (shared/service.py); `GraderService.stop`
        stops the worker instead."""


class GraderService:
    """Start/stop the grader: its internal topics, the runtime rules follower, then the faust worker."""

    def __init__(self, settings: GraderSettings, config: GraderConfig) -> None:
        self.settings = settings
        self.config = config
        self.grader: GraderApp | None = None
        self._worker: _Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._built = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._code = 0
        self.book = RuleBook(config)
        self._rules: Any = None

    def start(self) -> None:
        """Create the internal topics, then build and start the faust worker on its thread; returns once
        the worker is built (faust then joins the group and recovers its tables by itself). An error
        while building is raised here."""
        # The internal topics exist before faust subscribes: created by faust itself while it starts, the
        # join topic was sometimes missing from the first assignment ("Ignoring missing topic"), and
        # this worker then graded nothing until some later rebalance.
        # A missing private key stops the start here, in one line naming APPRENTICE_RECORD_KEYS_DIR
        # (shared/startup.py), before anything is read or written unsigned.
        record_signer(self.settings.common, SOURCE)
        ensure_internal_topics(self.settings)

        self._rules = follow(self.settings, self.book)  # the runtime rules, read whole before any grading
        self._thread = threading.Thread(target=self._run, name="faust-worker", daemon=True)
        self._thread.start()
        self._built.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self.grader = GraderApp(self.settings, self.config, book=self.book)
            worker = _Worker(self.grader.app, loglevel=self.settings.log_level, quiet=True,
                             redirect_stdouts=False, override_logging=False, loop=loop)
        except BaseException as e:
            self._error = e
            loop.close()
            self._done.set()
            self._built.set()
            return
        self._worker, self._loop = worker, loop
        self._built.set()
        try:
            worker.execute_from_commandline()
        except SystemExit as e:
            self._code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:
            refusal = kafka_refusal(e)
            if refusal is not None:     # the broker refused this principal: its one line, no traceback
                log.error("the faust worker stopped: %s", refusal)
            else:
                log.exception("the faust worker stopped on an error")
            self._code = 1
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the worker has stopped."""
        return self._done.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Stop the worker as a SIGTERM would and wait for it (without `grace`: until faust has shut down,
        as under its own signal handling; with it, at most that long)."""
        worker, loop = self._worker, self._loop
        if worker is not None and loop is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):    # the loop closed meanwhile: the worker has stopped
                loop.call_soon_threadsafe(worker._on_sigterm)
        if self._thread is not None:
            self._thread.join(grace)
            if self._thread.is_alive():
                log.error("the faust worker did not stop within the grace", extra={"seconds": grace})
        if self._rules is not None:
            self._rules.stop()
            self._rules = None

    @property
    def exit_code(self) -> int:
        return self._code
