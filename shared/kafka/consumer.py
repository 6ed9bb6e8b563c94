"""Kafka records --> batches for a handler, committed only after the handler's effect is durable.

Auto-commit is off: a crash between effect and commit redelivers the batch, so handlers must be
idempotent by `envelope.event_id` (the at-least-once + idempotent-effect recipe, docs/architecture.md §5).

A request the broker refuses this principal (its group, a topic: an ACL missing or revoked while it runs) is
counted and logged in one line naming the command that grants it (shared/kafka/authorization.py), never
raised: polls go on returning nothing, a refused commit is left for the redelivery above, and the consumer
resumes by itself once the grant is applied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import Counter

from shared.kafka.authorization import is_refusal, report_error
from shared.kafka.busy import call_while_polling
from shared.kafka.consumers import OffsetReset, new_consumer
from shared.kafka.security import SecuritySource

log = logging.getLogger(__name__)

T = TypeVar("T")

REBALANCES = Counter("apprentice_kafka_rebalance_events_total",
                     "Partition assignment changes seen by a consumer (assigned, revoked, lost)", ["group", "event"])
MAX_POLL_EXCEEDED = Counter("apprentice_kafka_max_poll_exceeded_total",
                            "Times a consumer left its group for not polling within max.poll.interval.ms",
                            ["group"])


class EventConsumer:
    def __init__(self, bootstrap: str, group_id: str, topics: Iterable[str], *,
                 auto_offset_reset: OffsetReset = "earliest", security: SecuritySource = None,
                 log_level: int | None = None, max_poll_interval_ms: int | None = None,
                 session_timeout_ms: int = 10_000) -> None:
        """`security`: TLS/SASL settings (shared/kafka/security.py); None = from the environment. The
        consumer comes from shared/kafka/consumers.py (read_committed, nothing committed but what
        `commit` is given; its client id names the group); `max_poll_interval_ms` None = librdkafka's 300 s;
        `log_level` 3 quiets a consumer that outlives broker restarts."""
        self.group_id = group_id
        self.topics = list(topics)
        self._security = security
        self.max_poll_interval_s = (max_poll_interval_ms or 300_000) / 1000
        self.rebalances = {"assigned": 0, "revoked": 0, "lost": 0}
        """Rebalance callbacks seen by this consumer (also `apprentice_kafka_rebalance_events_total`)."""
        self.max_poll_exceeded = 0
        self._consumer = new_consumer(bootstrap, purpose=group_id, group_id=group_id, security=security,
                                      offset_reset=auto_offset_reset, log_level=log_level,
                                      session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=1000,
                                      max_poll_interval_ms=max_poll_interval_ms)
        self._consumer.subscribe(self.topics, on_assign=self._assigned, on_revoke=self._revoked,
                                 on_lost=self._lost)

    def _count(self, event: str, partitions: list[TopicPartition]) -> None:
        self.rebalances[event] += 1
        REBALANCES.labels(self.group_id, event).inc()
        log.info("consumer group %s: partitions %s", self.group_id, event,
                 extra={"group": self.group_id, "partitions": len(partitions)})

    def _assigned(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        self._count("assigned", partitions)

    def _revoked(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        self._count("revoked", partitions)

    def _lost(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        self._count("lost", partitions)

    def poll_batch(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        """Up to `max_records` records, waiting at most `timeout` seconds. Fatal errors raise."""
        msgs = self._consumer.consume(num_messages=max_records, timeout=timeout)
        out = []
        for m in msgs:
            err = m.error()
            if err is None:
                out.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif err.code() == KafkaError._MAX_POLL_EXCEEDED:
                self.max_poll_exceeded += 1
                MAX_POLL_EXCEEDED.labels(self.group_id).inc()
                log.error("consumer group %s: left the group, no poll within max.poll.interval.ms (%.0f s); "
                          "it rejoins now and its uncommitted records are redelivered",
                          self.group_id, self.max_poll_interval_s)
            elif is_refusal(err):
                self._refused(err, m.topic() or (self.topics[0] if self.topics else ""))
            elif err.fatal():
                raise KafkaException(err)
            else:
                log.warning("consumer error (retried by librdkafka): %s", err)
        return out

    def _refused(self, err: KafkaError | KafkaException, topic: str) -> None:
        """Count and log a refusal of this consumer's group or topic (READ: what consuming and committing need)."""
        report_error(err, name=topic, group=self.group_id, operation="READ", security=self._security, logger=log)

    def _commit(self, offsets: list[TopicPartition]) -> None:
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            if not is_refusal(e):
                raise
            self._refused(e, offsets[0].topic)

    def commit(self, messages: Iterable[Message]) -> None:
        """Synchronously commit past the highest offset of each partition in `messages` (a refused commit is
        reported, not raised: the records are delivered again)."""
        highest: dict[tuple[str, int], int] = {}
        for m in messages:
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            if topic is None or partition is None or offset is None:
                raise ValueError(f"cannot commit a record with no position (error: {m.error()})")
            tp = (topic, partition)
            highest[tp] = max(highest.get(tp, -1), offset)
        if highest:
            self._commit([TopicPartition(t, p, o + 1) for (t, p), o in highest.items()])

    def commit_offsets(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit explicit next-offsets per (topic, partition)."""
        if offsets:
            self._commit([TopicPartition(t, p, o) for (t, p), o in offsets.items()])

    def call_while_polling(self, fn: Callable[[], T], *, stop: threading.Event | None = None) -> T:
        """`fn()` (a slow call to another service) on a worker thread while this consumer keeps its group
        membership, paused (shared/kafka/busy.py)."""
        return call_while_polling(self._consumer, fn, group=self.group_id, stop=stop,
                                  name=f"{self.group_id}-work")

    def assignment(self) -> list[TopicPartition]:
        return self._consumer.assignment()

    def committed(self, timeout: float = 10.0) -> list[TopicPartition]:
        return self._consumer.committed(self._consumer.assignment(), timeout=timeout)

    @property
    def raw(self) -> Consumer:
        return self._consumer

    def close(self) -> None:
        self._consumer.close()
