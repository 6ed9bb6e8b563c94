"""An interaction or feedback event (+ what the join state already holds) --> accepted, or why not (pure).

The grader's trust boundary toward the records it joins. Everything here is a reason to dead-letter one
record while the interaction it is about is still graded:

- bounded state: one interaction's join state is one changelog record and its graded record one Kafka
  record, so both must stay under Kafka's record limit whatever callers send (70 corrections of 20,000
  characters on one interaction once made a state over 1 MB that could never be written, and the grader
  retried it forever). Caps: feedback events per interaction, their total bytes, comment length, and an
  interaction small enough to leave room for its feedback (`Limits.max_interaction_bytes`);
- tenancy: feedback joins only an interaction of its own tenant (`envelope.tenant`);
- time: feedback happens after its interaction and not in the future, within a clock skew;
- producers: an interaction id belongs to the producer that used it first (a replay by the same
  producer is a duplicate, another producer's or tenant's copy is refused, not raced);
- interaction ids: with the MAC secret shared with inference, an id must verify for the record's
  tenant (shared/security/interaction_ids.py), so a Kafka writer cannot aim feedback at another tenant's
  interaction by guessing its id.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.proto.apprentice.v1 import common_pb2, events_pb2
from shared.security.interaction_ids import verify

STATE_HEADROOM = 64 * 1024
"""Bytes of a state (and of a graded record) that are neither the interaction nor its feedback: the
state header (event ids seen, judge results, timing) or the graded record's components and flags."""

# Dead-letter stages (DeadLetter.stage) of the refusals below.
STAGE_LIMITS = "grader.limits"
STAGE_TENANT = "grader.tenant"
STAGE_TIME = "grader.time"
STAGE_PRODUCER = "grader.producer"
STAGE_IDENTITY = "grader.identity"


@dataclass(frozen=True)
class Limits:
    """The grader's settings that bound what one interaction may accumulate (services/grader/settings.py
    documents each and builds them: `GraderSettings.limits()`)."""

    max_feedback: int = 32
    max_feedback_bytes: int = 128 * 1024
    max_comment_chars: int = 20_000
    skew_s: float = 300.0
    max_record_bytes: int = 1_000_000
    id_secret: bytes = b""

    def __post_init__(self) -> None:
        assert self.max_interaction_bytes > 0, (
            f"max_record_bytes ({self.max_record_bytes}) must exceed max_feedback_bytes "
            f"({self.max_feedback_bytes}) + {STATE_HEADROOM} bytes of headroom")

    @property
    def max_interaction_bytes(self) -> int:
        """The largest interaction record whose state, with a full feedback budget, still fits a record."""
        return self.max_record_bytes - self.max_feedback_bytes - STATE_HEADROOM


@dataclass(frozen=True)
class Refusal:
    """Why one record does not join: its dead-letter stage and a reason a person can act on."""

    stage: str
    reason: str


def _seconds(env: common_pb2.Envelope) -> float | None:
    return env.occurred_at.ToMicroseconds() / 1e6 if env.HasField("occurred_at") else None


# --- a record on its own (routing) ----------------------------------------------------------------------
def check_interaction(it: events_pb2.Interaction, size: int, limits: Limits) -> Refusal | None:
    if size > limits.max_interaction_bytes:
        return Refusal(STAGE_LIMITS, f"interaction record of {size} bytes exceeds the grader's limit of "
                                     f"{limits.max_interaction_bytes} (APPRENTICE_GRADER_MAX_RECORD_BYTES minus "
                                     "the feedback budget): its state could not be written")
    return _check_id(it.interaction_id, it.envelope.tenant, limits, "interaction")


def check_feedback(fb: events_pb2.FeedbackEvent, size: int, now: float, limits: Limits) -> Refusal | None:
    if len(fb.comment) > limits.max_comment_chars:
        return Refusal(STAGE_LIMITS, f"comment of {len(fb.comment)} characters exceeds "
                                     f"APPRENTICE_GRADER_MAX_COMMENT_CHARS={limits.max_comment_chars}")
    if size > limits.max_feedback_bytes:
        return Refusal(STAGE_LIMITS, f"feedback record of {size} bytes exceeds the per-interaction feedback "
                                     f"budget APPRENTICE_GRADER_MAX_FEEDBACK_BYTES={limits.max_feedback_bytes}")
    at = _seconds(fb.envelope)
    if at is None:
        return Refusal(STAGE_TIME, "feedback without envelope.occurred_at")
    if at > now + limits.skew_s:
        return Refusal(STAGE_TIME, f"feedback occurred_at is {at - now:.0f} s in the future (allowed skew "
                                   f"APPRENTICE_GRADER_FEEDBACK_SKEW_S={limits.skew_s:g})")
    return _check_id(fb.interaction_id, fb.envelope.tenant, limits, "feedback")


def _check_id(interaction_id: str, tenant: str, limits: Limits, what: str) -> Refusal | None:
    if limits.id_secret and not verify(interaction_id, tenant, limits.id_secret):
        return Refusal(STAGE_IDENTITY, f"{what}'s interaction id {interaction_id[:80]!r} was not issued to tenant "
                                       f"{tenant!r} (its MAC does not verify)")
    return None


# --- a record against the join state -------------------------------------------------------------------
def check_join(it: events_pb2.Interaction | None, fb: events_pb2.FeedbackEvent, size: int,
               joined: list[bytes], limits: Limits) -> Refusal | None:
    """May `fb` (`size` bytes) join the state that holds `joined` (and `it`, once it arrived)?"""
    if it is not None:
        refusal = check_pairing(it, fb, limits)
        if refusal is not None:
            return refusal
    if len(joined) >= limits.max_feedback:
        return Refusal(STAGE_LIMITS, f"interaction already has {len(joined)} feedback events "
                                     f"(APPRENTICE_GRADER_MAX_FEEDBACK={limits.max_feedback})")
    total = sum(map(len, joined)) + size
    if total > limits.max_feedback_bytes:
        return Refusal(STAGE_LIMITS, f"feedback on this interaction would total {total} bytes "
                                     f"(APPRENTICE_GRADER_MAX_FEEDBACK_BYTES={limits.max_feedback_bytes})")
    return None


def check_pairing(it: events_pb2.Interaction, fb: events_pb2.FeedbackEvent, limits: Limits) -> Refusal | None:
    """Feedback against the interaction it names: same tenant, and not from before the interaction."""
    if fb.envelope.tenant != it.envelope.tenant:
        return Refusal(STAGE_TENANT, f"feedback of tenant {fb.envelope.tenant!r} names an interaction of "
                                     f"another tenant")
    at, start = _seconds(fb.envelope), _seconds(it.envelope)
    if at is not None and start is not None and at < start - limits.skew_s:
        return Refusal(STAGE_TIME, f"feedback occurred_at is {start - at:.0f} s before its interaction (allowed "
                                   f"skew APPRENTICE_GRADER_FEEDBACK_SKEW_S={limits.skew_s:g})")
    return None


def check_same_producer(first: events_pb2.Interaction, again: events_pb2.Interaction) -> Refusal | None:
    """A second interaction under an id already joined: the same producer re-sending (a replay after a
    crash) is a duplicate (None); another producer or tenant is refused."""
    a, b = first.envelope, again.envelope
    if (a.tenant, a.source, a.principal.key_id) == (b.tenant, b.source, b.principal.key_id):
        return None
    return Refusal(STAGE_PRODUCER, f"interaction id already used by producer {_producer(a)}; this copy comes "
                                   f"from {_producer(b)}")


def _producer(env: common_pb2.Envelope) -> str:
    key = f", key {env.principal.key_id!r}" if env.principal.key_id else ""
    return f"{env.source!r} (tenant {env.tenant!r}{key})"


def oversize(state_bytes: int, emit: events_pb2.GradedInteraction | None, limits: Limits) -> Refusal | None:
    """The last line of defence behind the caps above: a state or graded record over the record limit
    is never handed to Kafka (it would fail the whole batch); the item that made it is refused instead."""
    if state_bytes > limits.max_record_bytes:
        return Refusal(STAGE_LIMITS, f"the interaction's join state would be {state_bytes} bytes, over "
                                     f"APPRENTICE_GRADER_MAX_RECORD_BYTES={limits.max_record_bytes}")
    if emit is not None and (size := emit.ByteSize()) > limits.max_record_bytes:
        return Refusal(STAGE_LIMITS, f"the graded record would be {size} bytes, over "
                                     f"APPRENTICE_GRADER_MAX_RECORD_BYTES={limits.max_record_bytes}")
    return None

