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

`run_bisecting` applies this policy to the items in hand (the faust agents: services/grader/stream/route.py
and grade.py). Waits between tries are shared/retry.py's `Backoff`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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


def classify(exc: BaseException) -> Failure:
    """What a batch raised --> its signature, and whether a record can have caused it."""
    name = _error_name(exc)
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


def _batch_backoff() -> Backoff:
    """Waits between tries of a batch that failed (0.2 s doubling to 10 s), per chunk."""
    return Backoff(first_s=0.2, max_s=10.0)


async def run_bisecting(items: Sequence[T], attempt: Callable[[Sequence[T]], Awaitable[None]], *,
                        poison: Callable[[T, Failure], Awaitable[None]], stage: str,
                        on_error: Callable[[], None] | None = None,
                        describe: Callable[[BaseException], Failure] = classify,
                        backoff: Callable[[], Backoff] = _batch_backoff) -> None:
    """Run `attempt(items)` until it succeeds (stream/route.py, stream/grade.py).
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
