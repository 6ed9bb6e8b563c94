"""A topic (or some of its partitions), from a start offset --> its records up to the end it had when the
read began, then stop.

Rebuilding state from a compacted topic (services/extractor/snapshots.py), catching up
on the grader's rules before following them, looking for ids written since a time (the grader's
recovery), printing rules, checking a test's output: each needs "everything up to now, and then stop",
and each hand-written loop got one of the careful parts wrong. They are done here, once:

- the end of each partition is its high watermark taken at the start; for a `read_committed` consumer
  (shared/kafka/consumers.py's default) the broker answers the last stable offset, so a transaction
  still open when the read begins neither blocks the read nor shows up in it;
- a partition is done when the consumer's position reaches its end, not when a record at `end - 1`
  arrives: the last offsets may be transaction markers or aborted records, which are never delivered;
- empty partitions (and those whose start is already at the end) are done before anything is polled;
- records past the end (written during the read) are not returned, and the partition is sought back to
  its end so a caller that goes on following (the rules follower) still gets them;
- watermarks of a freshly created topic are retried while its partitions have no leader yet;
- a read that cannot finish raises `ReadTimeout`, naming the partitions left and how far each got;
  retriable client errors are logged, fatal ones raised, and an authorization refusal (which no retry ends)
  raised at once as `KafkaAccessDenied` (shared/kafka/authorization.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeAlias

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from shared.kafka.authorization import raise_if_denied
from shared.kafka.consumers import Isolation, new_consumer
from shared.kafka.security import SecuritySource
from shared.retry import call

log = logging.getLogger(__name__)

Start: TypeAlias = int | Mapping[int, int]
"""Where to begin: `OFFSET_BEGINNING`, `OFFSET_END` or an offset for every partition, or a next-offset per
partition (partitions it does not name begin at the beginning)."""

_TRANSIENT = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT})
BATCH = 500


class TopicMissing(LookupError):
    """The topic does not exist (or its metadata carries an error)."""


class ReadTimeout(TimeoutError):
    """The read did not reach the end of every partition in time."""

    def __init__(self, topic: str, left: Mapping[int, tuple[int, int]], timeout_s: float) -> None:
        self.topic, self.left = topic, dict(left)
        where = ", ".join(f"[{p}] at {pos if pos >= 0 else 'no fetch yet'} of {end}"
                          for p, (pos, end) in sorted(left.items()))
        super().__init__(f"could not read {topic!r} to its end within {timeout_s:.0f}s: {where}")


def topic_partitions(consumer: Consumer, topic: str, timeout_s: float = 10.0, *,
                     settle_s: float = 3.0, security: SecuritySource = None) -> list[int]:
    """The partition numbers of `topic`, sorted (`TopicMissing` when it does not exist, `KafkaAccessDenied`
    when this principal may not see it; `security`: the consumer's, for that line).

    A topic created a moment ago can read as unknown on a broker whose metadata has not caught up with the
    controller yet, so an unknown topic is asked again for up to `settle_s` before it counts as missing.
    """
    settle_until = time.monotonic() + min(settle_s, timeout_s)
    while True:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        if meta is not None and meta.error is not None:
            raise_if_denied(meta.error, name=topic, operation="DESCRIBE", security=security)
        if time.monotonic() >= settle_until:
            why = meta.error if meta is not None and meta.error is not None else "missing"
            raise TopicMissing(f"topic {topic!r} is not available ({why}; `apprentice topics` creates it)")
        time.sleep(0.1)


def watermarks(consumer: Consumer, topic: str, partition: int, deadline: float) -> tuple[int, int]:
    """(low, high) offsets of one partition; retried while a fresh topic's partition has no leader yet."""
    def transient(e: BaseException) -> bool:
        return isinstance(e, KafkaException) and (e.args[0].retriable() or e.args[0].code() in _TRANSIENT)

    def once() -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                   timeout=max(1.0, deadline - time.monotonic()))
        return int(low), int(high)

    return call(once, retry_on=transient, what=f"watermarks of {topic}[{partition}]", attempts=None,
                deadline_s=max(0.0, deadline - time.monotonic()), first_s=0.2, max_s=1.0)


def _begin(consumer: Consumer, topic: str, bounds: Mapping[int, tuple[int, int]], start: Start,
           since_s: float | None, deadline: float) -> dict[int, int]:
    """The first offset to read per partition, within [low, high]."""
    if since_s is not None:
        ms = max(0, int(since_s * 1000))
        found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in bounds],
                                           timeout=max(1.0, deadline - time.monotonic()))
        # -1: no record at or after `since` in that partition, so nothing to read there
        wanted = {tp.partition: tp.offset if tp.offset >= 0 else bounds[tp.partition][1] for tp in found}
    elif isinstance(start, Mapping):
        wanted = {p: start.get(p, OFFSET_BEGINNING) for p in bounds}
    else:
        wanted = dict.fromkeys(bounds, start)
    out = {}
    for p, (low, high) in bounds.items():
        w = wanted[p]
        out[p] = low if w == OFFSET_BEGINNING else high if w == OFFSET_END else min(max(w, low), high)
    return out


def read_to_end(consumer: Consumer, topic: str, *, partitions: Iterable[int] | None = None,
                start: Start = OFFSET_BEGINNING, since_s: float | None = None,
                timeout_s: float = 30.0, security: SecuritySource = None) -> Iterator[Message]:
    """The records of `topic` (every partition, or `partitions`) from `start` (or from the first record
    at or after wall-clock time `since_s`) up to each partition's end at the call, in offset order per
    partition. `consumer` (built by shared/kafka/consumers.py) is assigned those partitions and left
    assigned at their ends: a caller may go on consuming from there, and closes it. A topic or group this
    principal is refused raises `KafkaAccessDenied` (`security`: the consumer's, for its line)."""
    deadline = time.monotonic() + timeout_s
    parts = sorted(partitions) if partitions is not None else topic_partitions(consumer, topic, timeout_s,
                                                                                 security=security)
    bounds = {p: watermarks(consumer, topic, p, deadline) for p in parts}
    begin = _begin(consumer, topic, bounds, start, since_s, deadline)
    ends = {p: high for p, (_low, high) in bounds.items()}
    consumer.assign([TopicPartition(topic, p, begin[p]) for p in parts])
    pending = {p for p in parts if begin[p] < ends[p]}
    overshot: set[int] = set()
    while pending:
        if time.monotonic() > deadline:
            positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in pending])}
            raise ReadTimeout(topic, {p: (positions.get(p, -1), ends[p]) for p in pending}, timeout_s)
        for m in consumer.consume(BATCH, min(0.2, max(0.0, deadline - time.monotonic()))):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                # a refused read never ends: the one line of shared/kafka/authorization.py, now
                raise_if_denied(err, name=topic, operation="READ", security=security)
                if err.fatal():
                    raise KafkaException(err)
                log.warning("reading %s: %s (retried by librdkafka)", topic, err)
                continue
            p, offset = int(m.partition() or 0), int(m.offset() or 0)
            if m.topic() != topic or p not in ends:
                continue
            if offset >= ends[p]:
                overshot.add(p)
                continue
            yield m
        # unfetched partitions report OFFSET_INVALID (< 0); markers and aborted records move the position on
        pending -= {tp.partition for tp in consumer.position([TopicPartition(topic, p) for p in pending])
                    if tp.offset >= ends[tp.partition]}
    for p in overshot:
        consumer.seek(TopicPartition(topic, p, ends[p]))


def read_topic_to_end(bootstrap: str, topic: str, *, purpose: str, security: SecuritySource = None,
                      isolation: Isolation = "read_committed", partitions: Iterable[int] | None = None,
                      start: Start = OFFSET_BEGINNING, since_s: float | None = None,
                      timeout_s: float = 30.0) -> Iterator[Message]:
    """`read_to_end` with a consumer of its own (a private group, committing nothing), closed when the
    read ends or the iterator is closed."""
    consumer = new_consumer(bootstrap, purpose=purpose, security=security, isolation=isolation)
    try:
        yield from read_to_end(consumer, topic, partitions=partitions, start=start, since_s=since_s,
                               timeout_s=timeout_s, security=security)
    finally:
        consumer.close()
