"""Kafka topic --> records, read from explicit per-partition offsets (the checkpoint's), not from a
consumer group's committed position.

Why not a group subscription: the trainer's effect (weights) is only durable inside a checkpoint, so the
offsets that say "everything before this is in the weights or the buffer" must be stored in that same
checkpoint. On start the reader is assigned every partition at the checkpointed next-offset; partitions
the checkpoint never saw start at the beginning (or the end, by setting). Offsets are also committed to
the group after each checkpoint, only so that lag monitoring (`apprentice status`) sees progress.
"""

from __future__ import annotations

import logging

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, Message, TopicPartition

from shared.kafka.authorization import report_error
from shared.kafka.consumers import new_consumer
from shared.kafka.reader import topic_partitions
from shared.kafka.security import SecuritySource

log = logging.getLogger(__name__)


class PartitionReader:
    def __init__(self, bootstrap: str, topic: str, group_id: str, start: dict[int, int] | None = None, *,
                 from_end: bool = False, metadata_timeout: float = 10.0, security: SecuritySource = None) -> None:
        self.topic = topic
        self._group, self._security = group_id, security
        self._consumer = new_consumer(bootstrap, purpose=f"trainer-{topic}", group_id=group_id, security=security)
        try:
            self.partitions = topic_partitions(self._consumer, topic, metadata_timeout)
        except Exception:
            self._consumer.close()
            raise
        start = start or {}
        default = OFFSET_END if from_end else OFFSET_BEGINNING
        self.start: dict[int, int] = dict(start)
        self.position: dict[int, int] = dict(start)      # next offset to read, per partition read so far
        self._consumer.assign([TopicPartition(topic, p, start.get(p, default)) for p in self.partitions])

    def poll(self, max_records: int = 500, timeout: float = 0.5) -> list[Message]:
        out = []
        for m in self._consumer.consume(num_messages=max_records, timeout=timeout):
            err = m.error()
            if err is None:
                out.append(m)
                self.position[int(m.partition() or 0)] = int(m.offset() or 0) + 1
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif err.fatal():
                raise KafkaException(err)
            elif not report_error(err, name=self.topic, group=self._group, operation="READ",
                                  security=self._security, logger=log):     # a refusal: its one counted line
                log.warning("consumer error (retried by librdkafka): %s", err)
        return out

    def positions(self) -> dict[int, int]:
        return dict(self.position)

    def commit(self, positions: dict[int, int]) -> None:
        """Informational commit to the consumer group (monitoring); the checkpoint is the source of truth."""
        if positions:
            try:
                self._consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in positions.items()],
                                      asynchronous=False)
            except KafkaException as e:
                if not report_error(e.args[0] if e.args else e, name=self.topic, group=self._group,
                                    operation="READ", security=self._security, logger=log):
                    log.warning("offset commit for monitoring failed: %s", e)

    def close(self) -> None:
        self._consumer.close()
