"""Event envelope and the topic -> protobuf message mapping (encode, decode, JSON for people).

Every record on every topic is a protobuf message from `protos/` carrying an `Envelope`; consumers use
`envelope.event_id` as their idempotency key.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp

from shared.contracts import topics as T
from shared.proto.apprentice.v1 import common_pb2, events_pb2

M = TypeVar("M", bound=Message)

MESSAGE_TYPES: dict[str, type[Message]] = {
    T.INTERACTIONS: events_pb2.Interaction,
    T.FEEDBACK: events_pb2.FeedbackEvent,
    T.GRADED: events_pb2.GradedInteraction,
    T.KNOWLEDGE: events_pb2.KnowledgeSnapshot,
    T.CHECKPOINTS: events_pb2.CheckpointPublished,
    T.MODEL_UPDATES: events_pb2.ModelUpdate,
    T.DEADLETTER: events_pb2.DeadLetter,
    T.AUDIT: events_pb2.AuditRecord,
}


class UndecodableEvent(ValueError):
    """A record that is not a valid event for its topic. Recoverable: dead-letter it and go on."""


def new_id() -> str:
    return str(uuid.uuid4())


def timestamp(dt: datetime | None = None) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(dt or datetime.now(UTC))
    return ts


def make_envelope(tenant: str, *, source: str, trace_id: str | None = None, event_id: str | None = None,
                  occurred_at: datetime | Timestamp | None = None) -> common_pb2.Envelope:
    """A fresh envelope. Pass `event_id` when the event must be deterministic (re-emissions)."""
    if not tenant:
        raise ValueError("every event carries a tenant")
    env = common_pb2.Envelope(event_id=event_id or new_id(), tenant=tenant, trace_id=trace_id or new_id(),
                              source=source)
    if isinstance(occurred_at, Timestamp):
        env.occurred_at.CopyFrom(occurred_at)
    else:
        env.occurred_at.CopyFrom(timestamp(occurred_at))
    return env


def deterministic_id(*parts: str) -> str:
    """A UUID5 over `parts`: the same logical event always gets the same id (idempotent re-emission)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "apprentice:" + "/".join(parts)))


def message_type(base_topic: str) -> type[Message]:
    try:
        return MESSAGE_TYPES[base_topic]
    except KeyError:
        raise KeyError(f"no message type for topic {base_topic!r}") from None


def decode(msg_type: type[M], data: bytes | None) -> M:
    """Parse and check the envelope; raise UndecodableEvent with a reason a person can act on."""
    if data is None:
        raise UndecodableEvent("record has no value (tombstone)")
    out = msg_type()
    try:
        out.ParseFromString(data)
    except DecodeError as e:
        raise UndecodableEvent(f"not a {msg_type.DESCRIPTOR.full_name}: {e}") from e
    env = getattr(out, "envelope", None)
    if env is not None and (not env.event_id or not env.tenant):
        raise UndecodableEvent(f"{msg_type.DESCRIPTOR.full_name} without envelope.event_id/tenant")
    return out


def to_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def to_json(msg: Message) -> str:
    return json.dumps(to_dict(msg), ensure_ascii=False, sort_keys=False)
