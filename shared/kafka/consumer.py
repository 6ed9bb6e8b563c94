"""Kafka records --> batches for a handler, committed only after the handler's effect is durable.

Auto-commit is off: a crash between effect and commit redelivers the batch, so handlers must be
idempotent by `envelope.event_id` (the at-least-once + idempotent-effect recipe, DESIGN.md section 8).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from shared.kafka.security import SecuritySource, librdkafka_config

log = logging.getLogger(__name__)


class EventConsumer:
    def __init__(self, bootstrap: str, group_id: str, topics: Iterable[str], *,
                 auto_offset_reset: str = "earliest", extra_config: dict[str, Any] | None = None,
                 security: SecuritySource = None) -> None:
        """`security`: TLS/SASL settings (shared/kafka/security.py); None = from the environment."""
        config: dict[str, Any] = {
            **librdkafka_config(security),
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": auto_offset_reset,
            "isolation.level": "read_committed",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
        }
        config.update(extra_config or {})
        self.group_id = group_id
        self.topics = list(topics)
        self._consumer = Consumer(config)
        self._consumer.subscribe(self.topics)

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
            elif err.fatal():
                raise KafkaException(err)
            else:
                log.warning("consumer error (retried by librdkafka): %s", err)
        return out

    def commit(self, messages: Iterable[Message]) -> None:
        """Synchronously commit past the highest offset of each partition in `messages`."""
        highest: dict[tuple[str, int], int] = {}
        for m in messages:
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            if topic is None or partition is None or offset is None:
                raise ValueError(f"cannot commit a record with no position (error: {m.error()})")
            tp = (topic, partition)
            highest[tp] = max(highest.get(tp, -1), offset)
        if highest:
            self._consumer.commit(offsets=[TopicPartition(t, p, o + 1) for (t, p), o in highest.items()],
                                  asynchronous=False)

    def commit_offsets(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit explicit next-offsets per (topic, partition)."""
        if offsets:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)

    def assignment(self) -> list[TopicPartition]:
        return self._consumer.assignment()

    def committed(self, timeout: float = 10.0) -> list[TopicPartition]:
        return self._consumer.committed(self._consumer.assignment(), timeout=timeout)

    @property
    def raw(self) -> Consumer:
        return self._consumer

    def close(self) -> None:
        self._consumer.close()
