"""Undecodable or rejected record --> `DeadLetter` on `apprentice.deadletter.v1`, tagged with the stage.

The dead letter must be durable before the consumer commits past the poison record, so `publish` waits
for delivery by default.
"""

from __future__ import annotations

import logging

from confluent_kafka import Message

from shared.contracts.events import make_envelope
from shared.kafka.producer import EventProducer
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)

VALUE_MAX = 256 * 1024
"""A dead letter keeps at most this much of the original value (its reason says when it was cut): the letter
must itself fit in a record, and the record being refused may be the largest the broker allows; a letter
that cannot be written would stop the consumer on the poison record for good."""
KEY_MAX = 4096
REASON_MAX = 2000


class DeadLetterPublisher:
    def __init__(self, producer: EventProducer, topic: str, *, source: str) -> None:
        self._producer = producer
        self._topic = topic
        self._source = source
        self.count = 0

    def publish(self, record: Message, *, stage: str, reason: str, error_type: str = "",
                tenant: str = "unknown", wait: bool = True) -> events_pb2.DeadLetter:
        key, value = record.key() or b"", record.value() or b""
        reason = reason[:REASON_MAX]
        if len(value) > VALUE_MAX:
            reason += f" [original value cut from {len(value)} to {VALUE_MAX} bytes]"
            value = value[:VALUE_MAX]
        if len(key) > KEY_MAX:
            reason += f" [original key cut from {len(key)} to {KEY_MAX} bytes]"
            key = key[:KEY_MAX]
        dl = events_pb2.DeadLetter(
            envelope=make_envelope(tenant, source=self._source),
            stage=stage, reason=reason, error_type=error_type,
            origin_topic=record.topic() or "", origin_partition=record.partition() or 0,
            origin_offset=record.offset() or 0, original_key=key, original_value=value,
        )
        self._producer.produce(self._topic, key or None, dl)
        if wait:
            self._producer.flush()
        self.count += 1
        log.warning("dead-lettered record", extra={"stage": stage, "reason": reason,
                                                    "origin": f"{record.topic()}/{record.partition()}@{record.offset()}"})
        return dl
