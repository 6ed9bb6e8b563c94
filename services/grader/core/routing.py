"""One source record (interactions or feedback topic) --> a join item, a judge item, or a rejection (pure).

Both runtimes route with this function, so they accept, key and reject exactly the same records:
an interaction becomes a join item keyed by its interaction id (plus a judge item keyed by its group
when its task has an LLM judge); feedback becomes a join item keyed by the interaction it is about;
an undecodable record, one of the wrong type or with values out of range (shared/contracts/validation.py), one
refused on its own by limits.py (size, comment, time, interaction-id MAC), or an interaction no grader
is configured for becomes a `Rejected`, which the runtime sends to the dead-letter topic
(`dead_letter`) before it commits past the record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.grader.core.join import FEEDBACK, INTERACTION, Rejected
from services.grader.core.limits import Limits, check_feedback, check_interaction
from services.grader.core.plan import plan_for
from shared.contracts.events import UndecodableEvent, make_envelope
from shared.contracts.validation import HeadersLike, InvalidEvent, decode_record, type_headers
from shared.grading import TaskGraders
from shared.proto.apprentice.v1 import events_pb2

DEADLETTER_VALUE_MAX = 256 * 1024
"""A dead letter keeps at most this much of the original value (its reason says when it was cut): a
letter must itself fit in a record, and the record being refused may be the largest the broker allows."""
DEADLETTER_HEADERS = type_headers(events_pb2.DeadLetter)
GRADED_HEADERS = type_headers(events_pb2.GradedInteraction)

TaskLookup = Callable[[str, str], TaskGraders | None]
"""(tenant, task) --> the task's graders, or None when nothing is configured (`Joiner.task_of`)."""


@dataclass(slots=True)
class Routed:
    join: tuple[bytes, bytes] | None = None
    """(interaction id, join item) for the pending table."""
    judge: tuple[bytes, bytes] | None = None
    """(group id, judge item) for the judge stage; None when the task has no LLM judge."""
    rejected: Rejected | None = None
    interaction: events_pb2.Interaction | None = None
    """The decoded interaction (so that a runtime joining it at once need not decode it again)."""


def route(is_interaction: bool, value: bytes | None, task_of: TaskLookup, headers: HeadersLike = None, *,
          limits: Limits | None = None, now: float | None = None) -> Routed:
    """Validate one record of the interactions (`is_interaction`) or feedback topic and key it for the join.
    `headers`: the record's Kafka headers (its type); `now`: the wall clock (feedback from the future)."""
    limits = limits or Limits()
    try:
        if is_interaction:
            it = decode_record(events_pb2.Interaction, value, headers)
            if not it.interaction_id:
                raise UndecodableEvent("Interaction without interaction_id")
            tenant = it.envelope.tenant
            refusal = check_interaction(it, len(value or b""), limits)
            if refusal is not None:
                return Routed(rejected=Rejected(refusal.stage, refusal.reason, "Refused", tenant))
            task = task_of(tenant, it.task)
            if task is None:
                return Routed(rejected=Rejected("grader.config", f"no grader configured for tenant {tenant!r} "
                                                f"task {it.task!r}", "NoGraderConfig", tenant))
            item = INTERACTION + value  # type: ignore[operator]  # decode() rejected None
            key = it.interaction_id.encode()
            judge = ((it.group_id or it.interaction_id).encode(), item) if _has_judge(task) else None
            return Routed(join=(key, item), judge=judge, interaction=it)
        fb = decode_record(events_pb2.FeedbackEvent, value, headers)
        if not fb.interaction_id:
            raise UndecodableEvent("FeedbackEvent without interaction_id")
        refusal = check_feedback(fb, len(value or b""), time.time() if now is None else now, limits)
        if refusal is not None:
            return Routed(rejected=Rejected(refusal.stage, refusal.reason, "Refused", fb.envelope.tenant))
        return Routed(join=(fb.interaction_id.encode(), FEEDBACK + value))  # type: ignore[operator]
    except InvalidEvent as e:
        return Routed(rejected=Rejected("grader.validate", str(e), type(e).__name__))
    except UndecodableEvent as e:
        return Routed(rejected=Rejected("grader.decode", str(e), type(e).__name__))


def dead_letter(rejected: Rejected, *, source: str, topic: str, partition: int, offset: int,
                key: bytes | None, value: bytes | None) -> events_pb2.DeadLetter:
    """The DeadLetter for a rejected record (or one join item of a record), tagged with its stage and origin.
    Key and value are cut to what a letter can carry (`DEADLETTER_VALUE_MAX`), saying so in the reason."""
    reason = rejected.reason[:2000]
    key, value = key or b"", value or b""
    if len(value) > DEADLETTER_VALUE_MAX:
        reason += f" [original value cut from {len(value)} to {DEADLETTER_VALUE_MAX} bytes]"
        value = value[:DEADLETTER_VALUE_MAX]
    if len(key) > 4096:
        reason += f" [original key cut from {len(key)} to 4096 bytes]"
        key = key[:4096]
    return events_pb2.DeadLetter(
        envelope=make_envelope(rejected.tenant or "unknown", source=source), stage=rejected.stage,
        reason=reason, error_type=rejected.error_type, origin_topic=topic,
        origin_partition=partition, origin_offset=offset, original_key=key, original_value=value)


def _has_judge(task: TaskGraders) -> bool:
    return bool(plan_for(task).judge_names)
