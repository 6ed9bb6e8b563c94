"""Slow work inside a consume loop --> done on a worker thread while the consumer keeps polling, paused.

Why: a consumer that does not poll for `max.poll.interval.ms` is thrown out of its group; its partitions
move to another member and back (two rebalances), and the records of the batch in hand are processed
again. A service that calls another one inside its loop (the extractor asks the Inference service for
extraction) would do exactly that whenever the dependency is slow or restarting. Here the call runs on a
worker thread; meanwhile the loop pauses every assigned partition (no new records are fetched: one batch
in flight is the back-pressure) and keeps calling poll, which keeps the membership alive (librdkafka
resets the poll-interval timer on each poll). Nothing about commits changes: the caller commits after
its effect is durable, as before, so a slow dependency only delays work.

A rebalance can still happen while paused (another member joins or leaves): partitions assigned then are
paused too, and a record fetched in the short window before that is put back (seek to its offset), so
nothing read here is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from prometheus_client import Counter

log = logging.getLogger(__name__)

T = TypeVar("T")

PAUSED_POLLS = Counter("apprentice_kafka_paused_polls_total",
                       "Polls made with every partition paused while slow work was in flight", ["group"])
PUT_BACK = Counter("apprentice_kafka_put_back_records_total",
                   "Records fetched while paused (a new assignment) and put back for later", ["group"])


class WorkAbandoned(RuntimeError):
    """The loop is stopping while work is still in flight: its records stay uncommitted (redelivered)."""


class _Outcome:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


def call_while_polling(consumer: Consumer, fn: Callable[[], T], *, group: str = "", poll_s: float = 0.2,
                       stop: threading.Event | None = None, name: str = "kafka-busy") -> T:
    """`fn()` on a worker thread; meanwhile `consumer` polls with all its partitions paused. Returns what
    `fn` returned (or raises what it raised) once its partitions are resumed. Raises WorkAbandoned when
    `stop` is set first (the worker thread is left to finish alone; nothing of it is committed)."""
    outcome = _Outcome()

    def work() -> None:
        try:
            outcome.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome.error = e
        finally:
            outcome.done.set()

    paused: set[tuple[str, int]] = set()
    _pause_assigned(consumer, paused)
    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while not outcome.done.is_set():
            if stop is not None and stop.is_set():
                raise WorkAbandoned("stopping with work in flight; its records will be redelivered")
            t0 = time.monotonic()
            _poll_paused(consumer, paused, group, poll_s)
            # consume() may return at once with every partition paused: wait out the poll period
            outcome.done.wait(max(0.0, poll_s - (time.monotonic() - t0)))
    finally:
        _resume(consumer, paused)
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]


def _pause_assigned(consumer: Consumer, paused: set[tuple[str, int]]) -> None:
    new = [tp for tp in consumer.assignment() if (tp.topic, tp.partition) not in paused]
    if new:
        consumer.pause(new)
        paused.update((tp.topic, tp.partition) for tp in new)


def _poll_paused(consumer: Consumer, paused: set[tuple[str, int]], group: str, poll_s: float) -> None:
    """One poll while paused: serves heartbeats and rebalance callbacks, fetches nothing (records of a
    partition assigned during the poll are sought back and the partition paused)."""
    msgs = consumer.consume(num_messages=100, timeout=poll_s)
    PAUSED_POLLS.labels(group).inc()
    first: dict[tuple[str, int], int] = {}
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise KafkaException(err)
            log.warning("consumer error while paused (retried by librdkafka): %s", err)
            continue
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        if topic is not None and partition is not None and offset is not None:
            tp = (topic, partition)
            first[tp] = min(first.get(tp, offset), offset)
    _pause_assigned(consumer, paused)
    for (topic, partition), offset in first.items():
        consumer.seek(TopicPartition(topic, partition, offset))
        PUT_BACK.labels(group).inc()
    if first:
        log.info("records fetched while paused were put back", extra={"partitions": len(first)})


def _resume(consumer: Consumer, paused: set[tuple[str, int]]) -> None:
    """Resume what this call paused and the consumer still holds (a revoked partition is not resumed)."""
    held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    back = [TopicPartition(t, p) for t, p in paused if (t, p) in held]
    if back:
        consumer.resume(back)
