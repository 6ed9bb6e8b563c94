"""Kafka records --> decoded events, poison records --> dead-letter topic (then the consumer goes on)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from confluent_kafka import Message
from google.protobuf.message import Message as ProtoMessage

from shared.contracts.events import UndecodableEvent
from shared.contracts.validation import decode_record
from shared.kafka.deadletter import DeadLetterPublisher

M = TypeVar("M", bound=ProtoMessage)


def decode_batch(records: Iterable[Message], msg_type: type[M], deadletters: DeadLetterPublisher,
                 *, stage: str) -> list[tuple[Message, M]]:
    """Decode and check each record (shared/contracts/validation.py: its type header, envelope and values); one that
    fails is dead-lettered (durably, before the caller commits past it) and left out of the result."""
    out: list[tuple[Message, M]] = []
    for rec in records:
        try:
            out.append((rec, decode_record(msg_type, rec.value(), rec.headers())))
        except UndecodableEvent as e:
            deadletters.publish(rec, stage=stage, reason=str(e), error_type=type(e).__name__)
    return out
