"""A batch that failed + why --> retry it, split it, or give up on one record (pure: no Kafka, no clock).

Before: a record the broker refused (a state over the record limit) failed its whole batch; the batch
was retried forever, and nothing else was graded, for any tenant, also after a restart. Now:

- a failure a record can cause (`record_caused`: the broker or client refused a record as too large or
  invalid, or our own code raised on it) that repeats *the same way* (same error, batch starting at
  the same place) splits the batch in halves, the first half first; halves that still fail the same
  way are split again, down to one record, which is then dead-lettered ("poison") while every other
  record of the batch is graded;
- any other failure (broker down, a time-out, fenced, not authorised) is retried as it is, with a
  backoff: splitting cannot help, and dead-lettering good records while the cluster is sick would lose
  them.

`Bisector` is the native runtime's bookkeeping (services/grader/stage.py): the consumer gives it the
records of each batch, it says how many to take. The faust runtime runs the same policy over the
items in hand (`run_bisecting`). Waits between tries are shared/retry.py's `Backoff`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from shared.retry import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

POISON_STAGE = "grader.write"
"""Dead-letter stage of a record that every batch holding it failed on."""

# librdkafka error names (KafkaError.name()) and aiokafka error classes that only a record can cause.
RECORD_ERRORS = frozenset({
    "MSG_SIZE_TOO_LARGE", "INVALID_RECORD", "INVALID_MSG", "INVALID_MSG_SIZE", "RECORD_LIST_TOO_LARGE",
    "POLICY_VIOLATION", "CORRUPT_MESSAGE", "INVALID_TIMESTAMP",
    "MessageSizeTooLargeError", "RecordTooLargeError", "RecordListTooLargeError", "InvalidMessageError",
    "CorruptRecordException", "InvalidTimestampError", "PolicyViolationError",
})
KAFKA_MODULES = ("confluent_kafka", "cimpl", "aiokafka", "kafka")
"""Exceptions from these modules are the client's; any other exception raised on a batch is our code
failing on a record (a bug, or a user verifier gone wrong outside the join's own guard)."""


@dataclass(frozen=True)
class Failure:
    signature: str
    """What failed and how, e.g. `MSG_SIZE_TOO_LARGE on test.apprentice.graded.v1`: equal signatures are
    "the same way"."""
    record_caused: bool


def classify(exc: BaseException, delivery_error: str = "") -> Failure:
    """`exc`: what a batch raised. `delivery_error`: the first per-record delivery error name the
    producer reported in that batch (a transaction's commit only says that something failed)."""
    name = delivery_error.split(" ", 1)[0] if delivery_error else _error_name(exc)
    if delivery_error:
        return Failure(delivery_error, name in RECORD_ERRORS)
    module = type(exc).__module__.split(".", 1)[0]
    if module in KAFKA_MODULES or name != type(exc).__name__:
        return Failure(f"{name}: {str(exc)[:200]}", name in RECORD_ERRORS)
    return Failure(f"{type(exc).__name__}: {str(exc)[:200]}", True)


def _error_name(exc: BaseException) -> str:
    """The librdkafka error name inside a confluent KafkaException, else the exception's class name."""
    args = getattr(exc, "args", ())
    err = args[0] if args else None
    name = getattr(err, "name", None)
    if callable(name):
        try:
            return str(name())
        except Exception:  # noqa: BLE001 - not a KafkaError after all
            pass
    return type(exc).__name__


@dataclass
class Bisector:
    """How many of the next records a batch may take, after failures (native runtime, stage.py).

    `limit` is `batch_max` until a record-caused failure repeats at the same start with the same
    signature; then each failure with that signature halves it, and a one-record batch that fails so is
    poison. `limit` returns to `batch_max` once the records of the batch that first failed have all been
    processed or dead-lettered."""

    batch_max: int
    limit: int = 0
    _last: tuple[Hashable, str] | None = None
    _confirmed: str = ""
    _window: dict[Hashable, int] = field(default_factory=dict)
    """partition -> the last offset of the batch that failed twice: bisecting ends past these."""

    def __post_init__(self) -> None:
        self.limit = self.limit or self.batch_max

    def failed(self, positions: Sequence[tuple[Hashable, int]], failure: Failure) -> bool:
        """A batch of the records at `positions` ((partition, offset) in batch order) failed. Returns True
        when it is one record that must be dead-lettered; else the caller retries (taking `limit`)."""
        if not failure.record_caused or not positions:
            return False  # retried as it is: the cluster, not a record
        start = positions[0]
        again = self._last == (start, failure.signature) or failure.signature == self._confirmed
        self._last = (start, failure.signature)
        if not again:
            return False
        if not self._confirmed:
            self._window = {}
            for part, offset in positions:
                self._window[part] = max(offset, self._window.get(part, -1))
        self._confirmed = failure.signature
        if len(positions) == 1:
            return True
        self.limit = max(1, len(positions) // 2)
        log.warning("a batch failed twice the same way; splitting it",
                    extra={"records": len(positions), "next": self.limit, "failure": failure.signature[:300]})
        return False

    def succeeded(self, positions: Sequence[tuple[Hashable, int]]) -> None:
        """A batch of the records at `positions` committed."""
        self._last = None
        if not self._confirmed:
            return
        for part, offset in positions:
            if offset >= self._window.get(part, offset + 1):
                self._window.pop(part, None)
        if not self._window:
            self._reset()

    def poisoned(self) -> None:
        """The poison record was dead-lettered: back to whole batches."""
        self._reset()

    def _reset(self) -> None:
        self.limit, self._last, self._confirmed, self._window = self.batch_max, None, "", {}


def _batch_backoff() -> Backoff:
    """Waits between tries of a batch that failed (0.2 s doubling to 10 s), per chunk."""
    return Backoff(first_s=0.2, max_s=10.0)


async def run_bisecting(items: Sequence[T], attempt: Callable[[Sequence[T]], Awaitable[None]], *,
                        poison: Callable[[T, Failure], Awaitable[None]], stage: str,
                        on_error: Callable[[], None] | None = None,
                        describe: Callable[[BaseException], Failure] = classify,
                        backoff: Callable[[], Backoff] = _batch_backoff) -> None:
    """Run `attempt(items)` until it succeeds (the faust runtime's agents: faust_route.py, faust_grade.py).
    A record-caused failure that repeats the same way splits the items in halves (run in order); a
    single item that fails so goes to `poison` (which dead-letters it). Other failures are retried after
    the next wait of `backoff()` (shared/retry.py; one schedule per chunk). Cancellation (shutdown)
    passes through at every await."""
    chunks: list[Sequence[T]] = [items]
    confirmed = ""
    while chunks:
        chunk = chunks.pop(0)
        last = ""
        waits = backoff()
        while True:
            try:
                await attempt(chunk)
                break
            except Exception as e:  # noqa: BLE001 - the batch must never reach faust's supervisor
                f = describe(e)
                log.warning("batch failed; retrying it", exc_info=True,
                            extra={"stage": stage, "attempt": waits.failures + 1, "items": len(chunk),
                                   "failure": f.signature[:300]})
                if on_error is not None:
                    on_error()
                if f.record_caused and f.signature in (last, confirmed):
                    confirmed = f.signature
                    if len(chunk) == 1:
                        await _until_sent(poison, chunk[0], f, stage, backoff())
                        break
                    half = len(chunk) // 2
                    log.warning("a batch failed twice the same way; splitting it",
                                extra={"stage": stage, "items": len(chunk), "failure": f.signature[:300]})
                    chunks[:0] = [chunk[:half], chunk[half:]]
                    break
                last = f.signature if f.record_caused else ""
                await asyncio.sleep(waits.next())


async def _until_sent(poison: Callable[[T, Failure], Awaitable[None]], item: T, f: Failure, stage: str,
                      waits: Backoff) -> None:
    """`poison(item, f)` until it succeeds: the dead-letter topic itself may be unavailable for a while."""
    while True:
        try:
            await poison(item, f)
            return
        except Exception:  # noqa: BLE001 - retried with the next wait of `waits`
            log.exception("could not dead-letter a poison record; retrying",
                          extra={"stage": stage, "attempt": waits.failures + 1})
            await asyncio.sleep(waits.next())
