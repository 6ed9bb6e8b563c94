"""Kafka record (value bytes + headers) --> a checked event, or the reason it must be dead-lettered.

The one place where every consumer decides whether a record on an Apprentice topic may be trusted
(`decode_record`); producers mark what they write in the same place (`type_headers`). Three checks:

1. Its type. Every Apprentice producer writes the protobuf full name of the value into the header
   `apprentice-type` (e.g. `apprentice.v1.Interaction`). A header naming another type is always
   refused: a FeedbackEvent written to the interactions topic parses as an Interaction (protobuf is
   permissive), and was graded as one. A record *without* the header (an outside producer, or a record
   written before producers set it) is accepted only if its bytes parse as the topic's type with no
   field of the wrong wire type (`_check_wire_types`: the sign of another message's bytes) and its
   values pass check 3; a deployment whose topics only Apprentice writes loses nothing by that, and
   an outside producer keeps working.
2. Its envelope (`shared.contracts.events.decode`): an event id and a tenant.
3. Its values: no NaN or infinity in any float or double field, at any depth (a NaN rating became the
   maximum reward 1.0), timestamps in range, and the ranges each message type promises in `protos/`
   (rating 1..5, thumbs +-1, a known feedback kind, latency >= 0, log-probs <= 0, canary fraction in
   [0, 1], ...). Nested messages are checked by their own rules (a graded record's interaction and
   feedback as if they had come alone).

Refusals raise `InvalidEvent`, a subclass of `UndecodableEvent`: callers that already dead-letter an
undecodable record dead-letter these the same way, with the precise reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, NoReturn, TypeVar

import numpy as np
from google.protobuf import unknown_fields
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from shared.contracts.events import MESSAGE_TYPES, UndecodableEvent, decode
from shared.proto.apprentice.v1 import events_pb2

M = TypeVar("M", bound=Message)

TYPE_HEADER = "apprentice-type"
"""Kafka header holding the value's protobuf full name, e.g. `apprentice.v1.Interaction`."""

FEEDBACK_KINDS = ("thumbs", "rating", "correction", "kpi")
LOGPROB_MAX = 1e-3
"""Log-probabilities are <= 0; float32 rounding of log_softmax may leave a greedy token a hair above."""
MAX_TIMESTAMP_S = 253402300799
"""9999-12-31T23:59:59Z, the largest time `google.protobuf.Timestamp` may hold."""
MAX_ID_CHARS = 256
"""Ids and tenant names (event_id, tenant, interaction_id) are keys of state and labels of metrics."""
MAX_SAMPLES = 16
"""`SamplingParams.n` is at most 16 (common.proto)."""


class InvalidEvent(UndecodableEvent):
    """A record that parses but must not be trusted: another type, or values out of range. Recoverable:
    dead-letter it and go on."""


HeadersLike = Iterable[tuple[str, Any]] | Mapping[str, Any] | None
"""confluent-kafka gives a list of (name, bytes) or None; aiokafka / faust a tuple of pairs or a mapping."""
KafkaHeaders = list[tuple[str, str | bytes | None]]
"""Headers as producers take them."""


# --- producers -------------------------------------------------------------------------------------
def type_headers(msg_type: type[Message] | Message) -> KafkaHeaders:
    """The headers every producer attaches to a record whose value is `msg_type`."""
    return [(TYPE_HEADER, msg_type.DESCRIPTOR.full_name.encode())]


def type_headers_for_topic(topic: str) -> KafkaHeaders | None:
    """The type headers for a record on `topic` (any prefix), or None for a topic that is not an
    Apprentice event topic (internal topics, changelogs). For producers that only hold bytes."""
    for base, msg_type in MESSAGE_TYPES.items():
        if topic.endswith(base):  # the contract name after any prefix (no base name ends another)
            return type_headers(msg_type)
    return None


# --- consumers -------------------------------------------------------------------------------------
def header_type(headers: HeadersLike) -> str | None:
    """The type named by the record's `apprentice-type` header; None when it has none. Several copies
    that disagree are refused (a producer cannot say two things)."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found: str | None = None
    for name, value in pairs:
        if name != TYPE_HEADER:
            continue
        text = value.decode("utf-8", errors="replace") if isinstance(value, bytes | bytearray) else str(value or "")
        if found is not None and text != found:
            raise InvalidEvent(f"conflicting {TYPE_HEADER} headers: {found!r} and {text!r}")
        found = text
    return found


def decode_record(msg_type: type[M], value: bytes | None, headers: HeadersLike = None) -> M:
    """Parse and check one record for a topic whose values are `msg_type` (module docstring). Raises
    UndecodableEvent (or its subclass InvalidEvent) with a reason a person can act on."""
    named = header_type(headers)
    expected = msg_type.DESCRIPTOR.full_name
    if named is not None and named != expected:
        raise InvalidEvent(f"record says it is a {named} ({TYPE_HEADER} header), this topic carries {expected}")
    msg = decode(msg_type, value)
    check_event(msg)
    return msg


def check_event(msg: Message) -> None:
    """Check 3 of the module docstring (and the wire types) on a parsed message; raise InvalidEvent."""
    _check_wire_types(msg, msg.DESCRIPTOR, msg.DESCRIPTOR.name)
    _walk(msg, msg.DESCRIPTOR.name)


# --- the walk ----------------------------------------------------------------------------------------
_FLOAT, _FLOATS, _MSG, _MSGS, _MAP_FLOAT, _MAP_MSG = range(6)
"""What `_walk` checks in a field: a float, floats, a message, messages, a map to floats / to messages."""
_FLOAT_TYPES = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


Plan = tuple[tuple[tuple[str, int, float | None], ...], Callable[[Any, str], None] | None]
_planning: set[str] = set()


@cache
def _plan(desc: Descriptor) -> Plan:
    """What the walk reads of a `desc` message: (field name, what to check, upper bound) for its float
    fields and for its message fields whose type has something to check, and the type's rule. Listing
    every set field, or walking into messages with nothing to check (chat messages), costs more than the
    checks themselves."""
    _planning.add(desc.full_name)
    entries: list[tuple[str, int, float | None]] = []
    for fd in desc.fields:
        if fd.type in _FLOAT_TYPES:
            entries.append((fd.name, _FLOATS if fd.is_repeated else _FLOAT, _UPPER.get((desc.full_name, fd.name))))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                vfd = fd.message_type.fields_by_name["value"]
                if vfd.type in _FLOAT_TYPES:
                    entries.append((fd.name, _MAP_FLOAT, None))
                elif vfd.type == FieldDescriptor.TYPE_MESSAGE and _needs(vfd.message_type):
                    entries.append((fd.name, _MAP_MSG, None))
            elif _needs(fd.message_type):
                entries.append((fd.name, _MSGS if fd.is_repeated else _MSG, None))
    _planning.discard(desc.full_name)
    return tuple(entries), _RULES.get(desc.full_name)


def _needs(desc: Descriptor) -> bool:
    if desc.full_name in _planning:  # a recursive type: walk it (its plan is being made)
        return True
    entries, rule = _plan(desc)
    return bool(entries) or rule is not None


def _walk(msg: Message, path: str) -> None:
    entries, rule = _plan(msg.DESCRIPTOR)
    for name, kind, upper in entries:
        if kind == _FLOAT:
            value = getattr(msg, name)
            if not math.isfinite(value):
                raise InvalidEvent(f"{path}.{name} is {value} (must be a finite number)")
        elif kind == _MSG:
            if msg.HasField(name):
                _walk(getattr(msg, name), f"{path}.{name}")
        elif kind == _FLOATS:
            values = getattr(msg, name)
            if len(values):
                _check_floats(values, path, name, upper)
        elif kind == _MSGS:
            for i, item in enumerate(getattr(msg, name)):
                _walk(item, f"{path}.{name}[{i}]")
        elif kind == _MAP_FLOAT:
            for k, v in getattr(msg, name).items():
                if not math.isfinite(v):
                    raise InvalidEvent(f"{path}.{name}[{k!r}] is {v} (must be a finite number)")
        else:
            for k, v in getattr(msg, name).items():
                _walk(v, f"{path}.{name}[{k!r}]")
    if rule is not None:
        rule(msg, path)


def _check_floats(values: Sequence[float], path: str, name: str, upper: float | None) -> None:
    """Every value finite (and at most `upper`, when the field has a bound). A sum is finite iff every
    term is, unless it overflows (float32 terms cannot overflow a float64 sum; doubles near 1e308
    could, and then the element check says which one is at fault, or passes them all)."""
    if len(values) < 48:
        total, top = sum(values), (max(values) if upper is not None else None)
        if not math.isfinite(total):
            for i, v in enumerate(values):
                if not math.isfinite(v):
                    raise InvalidEvent(f"{path}.{name}[{i}] is {v} (must be a finite number)")
    else:
        # Reading a protobuf repeated field element by element costs ~60 ns each; numpy takes it at once.
        a = np.asarray(values, dtype=np.float64)
        if not math.isfinite(a.sum()):
            bad = np.flatnonzero(~np.isfinite(a))
            if bad.size:
                raise InvalidEvent(f"{path}.{name}[{int(bad[0])}] is {a[bad[0]]} (must be a finite number)")
        top = float(a.max()) if upper is not None else None
    if top is not None and upper is not None and top > upper:
        raise InvalidEvent(f"{path}.{name} holds {top:g}; must be at most {upper:g}")


def _check_wire_types(msg: Message, desc: Descriptor, path: str) -> None:
    """A field number the type knows, but with another wire type, means the bytes are another message
    (a FeedbackEvent's `value`, a double, lands on an Interaction's `task`, a string). Unknown field
    *numbers* are fine: a newer producer may have added fields (protos/ only ever adds). Checked on the
    top-level message, whose type is the question; a nested mismatch only drops a field."""
    unknown = unknown_fields.UnknownFieldSet(msg)
    if not len(unknown):
        return
    for f in unknown:
        fd = desc.fields_by_number.get(f.field_number)
        if fd is not None:
            raise InvalidEvent(f"{path}: field {f.field_number} ({fd.name}) has the wrong wire type: these bytes "
                               f"are not a {desc.full_name}")


# --- per-type rules (what protos/ promises about each message) ---------------------------------------
# Each rule tests, then builds its message only on failure: they run on every record.
def _fail(path: str, what: str) -> NoReturn:
    raise InvalidEvent(f"{path}: {what}")


def _timestamp(ts: Any, path: str) -> None:
    if not (0 <= ts.seconds <= MAX_TIMESTAMP_S and 0 <= ts.nanos < 1_000_000_000):
        _fail(path, f"timestamp out of range (seconds={ts.seconds}, nanos={ts.nanos})")


def _envelope(env: Any, path: str) -> None:
    if len(env.event_id) > MAX_ID_CHARS or len(env.tenant) > MAX_ID_CHARS:
        _fail(path, f"event_id and tenant must be at most {MAX_ID_CHARS} characters")


def _sampling(s: Any, path: str) -> None:
    if s.temperature < 0:
        _fail(path, f"temperature must be >= 0; got {s.temperature:g}")
    if not 0 <= s.top_p <= 1:
        _fail(path, f"top_p must lie in [0, 1]; got {s.top_p:g}")
    if s.top_k < 0 or s.max_new_tokens < 0:
        _fail(path, "top_k and max_new_tokens must be >= 0")
    if not 0 <= s.n <= MAX_SAMPLES:
        _fail(path, f"n must lie in [0, {MAX_SAMPLES}]; got {s.n}")


def _interaction(it: Any, path: str) -> None:
    if len(it.interaction_id) > MAX_ID_CHARS:
        _fail(path, f"interaction_id longer than {MAX_ID_CHARS} characters")
    if it.latency_ms < 0:
        _fail(path, f"latency_ms must be >= 0; got {it.latency_ms:g}")
    n = len(it.response_token_ids)
    for name in ("response_logprobs", "response_logprobs_t1"):  # their bound: _UPPER
        k = len(getattr(it, name))
        if k and k != n:
            _fail(path, f"{name} has {k} entries for {n} response tokens")
    if it.group_size < 0 or it.sample_index < 0:
        _fail(path, "group_size and sample_index must be >= 0")
    if it.group_size and it.sample_index >= it.group_size:
        _fail(path, f"sample_index {it.sample_index} is not below group_size {it.group_size}")
    # An interaction is a prompt and its answer: bytes with neither are most likely another message
    # (a FeedbackEvent parses as an Interaction when its value is 0 and so absent from the wire).
    if not (n or it.response_text or it.messages or it.prompt_text):
        _fail(path, "an Interaction needs a prompt or a response")


def _feedback(fb: Any, path: str) -> None:
    if len(fb.interaction_id) > MAX_ID_CHARS:
        _fail(path, f"interaction_id longer than {MAX_ID_CHARS} characters")
    kind, value = fb.kind, fb.value
    if kind == "thumbs":
        if value != 1.0 and value != -1.0:
            _fail(path, f"thumbs feedback needs value +1 or -1; got {value:g}")
    elif kind == "rating":
        if not 1.0 <= value <= 5.0:
            _fail(path, f"rating feedback needs value within [1, 5]; got {value:g}")
    elif kind == "kpi":
        if not fb.kpi_name:
            _fail(path, "kpi feedback needs kpi_name")
    elif kind != "correction":
        _fail(path, f"kind must be one of {', '.join(FEEDBACK_KINDS)}; got {kind!r}")


def _component(c: Any, path: str) -> None:
    if c.weight < 0:
        _fail(path, f"weight must be >= 0; got {c.weight:g}")


def _graded(g: Any, path: str) -> None:
    if g.revision < 1:
        _fail(path, f"revision must be >= 1; got {g.revision}")


_ACTIONS = frozenset({events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_CANARY,
                      events_pb2.UPDATE_ACTION_ROLLBACK})
_ITEM_STATUSES = frozenset(events_pb2.ItemStatus.values())


def _model_update(u: Any, path: str) -> None:
    if u.action not in _ACTIONS:
        _fail(path, f"unknown action {u.action}")
    if not 0.0 <= u.canary_fraction <= 1.0:
        _fail(path, f"canary_fraction must lie in [0, 1]; got {u.canary_fraction:g}")


def _knowledge_item(item: Any, path: str) -> None:
    if item.status not in _ITEM_STATUSES:
        _fail(path, f"unknown item status {item.status}")
    if item.helpful < 0 or item.harmful < 0 or item.token_count < 0:
        _fail(path, "helpful, harmful and token_count must be >= 0")


def _snapshot(s: Any, path: str) -> None:
    if s.version < 0:
        _fail(path, f"version must be >= 0; got {s.version}")


_UPPER: dict[tuple[str, str], float] = {
    ("apprentice.v1.Interaction", "response_logprobs"): LOGPROB_MAX,
    ("apprentice.v1.Interaction", "response_logprobs_t1"): LOGPROB_MAX,
}
"""(message, repeated float field) -> the largest value it may hold (checked with its finiteness)."""

_RULES: dict[str, Callable[[Any, str], None]] = {
    "google.protobuf.Timestamp": _timestamp,
    "apprentice.v1.Envelope": _envelope,
    "apprentice.v1.SamplingParams": _sampling,
    "apprentice.v1.Interaction": _interaction,
    "apprentice.v1.FeedbackEvent": _feedback,
    "apprentice.v1.RewardComponent": _component,
    "apprentice.v1.GradedInteraction": _graded,
    "apprentice.v1.ModelUpdate": _model_update,
    "apprentice.v1.KnowledgeItem": _knowledge_item,
    "apprentice.v1.KnowledgeSnapshot": _snapshot,
}
