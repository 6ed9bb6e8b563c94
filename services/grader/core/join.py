"""PendingState + one join event (interaction | feedback | judge result | tick) --> PendingState + maybe a
GradedInteraction. Pure: no Kafka, no clock of its own (`now` is passed in), testable in isolation.

Timing rules:
- A task without weighted feedback graders emits revision 1 as soon as the interaction (and any judge
  result) is there: the immediate graders decide.
- A task with feedback graders waits until its feedback is complete (`emit_when`) or the window ends
  (interaction occurred_at + `feedback_window_s`). At expiry without feedback, a task that *needs*
  feedback emits `has_signal=False` (`no_signal_reason="window_expired"`), never a reward of 0.
- After the first emission, any new feedback that changes the content emits revision n+1 (late
  feedback is never dropped silently); content that does not change emits nothing.
- Infrastructure failures and tool time-outs emit at once, masked (`has_signal=False`).
- Duplicate events (same event id) change nothing; a second copy of an interaction id from the same
  producer is ignored, one from another producer or tenant is refused (limits.py).
- Feedback joins only within the bounds of limits.py (tenant, time, count, bytes); feedback refused
  there, including feedback that waited for its interaction, goes to the dead-letter topic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from services.grader.core import detectors as D
from services.grader.core.bundles import BadJoinRecord
from services.grader.core.components import combine, compute_components, feedback_complete
from services.grader.core.limits import Limits, Refusal, check_join, check_pairing, check_same_producer
from services.grader.core.plan import plan_for
from services.grader.core.rulebook import RuleBook
from services.grader.core.state import PendingState
from shared.contracts.events import deterministic_id, new_id
from shared.grading import GraderConfig, TaskGraders
from shared.grading.replies import reply_key
from shared.proto.apprentice.v1 import common_pb2, events_pb2

log = logging.getLogger(__name__)

# Join items: (interaction id, kind byte + payload). Kinds:
INTERACTION = b"I"
FEEDBACK = b"F"
JUDGE = b"J"
TICK = b"T"
KINDS = (INTERACTION, FEEDBACK, JUDGE, TICK)
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""`json.dumps(..., separators=(",", ":"))` without building an encoder per call."""


@dataclass(frozen=True)
class Rejected:
    """Why a record (or one join item) goes to the dead-letter topic instead of the join."""

    stage: str
    reason: str
    error_type: str
    tenant: str = "unknown"


@dataclass(slots=True)
class Step:
    state: PendingState | None
    """The new state; None = delete the key (retention over, or an orphan)."""
    changed: bool
    """The state must be written to the changelog."""
    emit: events_pb2.GradedInteraction | None = None
    note: str = ""
    """Why nothing happened (duplicate, orphan, ...), for metrics and logs."""
    refused: list[tuple[bytes, Rejected]] = field(default_factory=list)
    """Feedback removed from the state by this step, (FeedbackEvent bytes, why), for the dead-letter
    topic: feedback that waited for its interaction and turned out not to belong to it."""


def letter_value(rejected: Rejected, value: bytes) -> bytes:
    """What the dead letter of a join item keeps: for a refusal (limits.py), the event as it was on its
    topic (without the item's kind byte), so that it reads as the topic's type; else the item itself."""
    return value[1:] if rejected.error_type == "Refused" and value[:1] in (INTERACTION, FEEDBACK) else value


class Refused(Exception):  # noqa: N818 - a refusal, not an error
    """The item must not join this state (limits.py). Recoverable: the item is dead-lettered, the state
    stays as it was."""

    def __init__(self, refusal: Refusal, tenant: str) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal
        self.tenant = tenant or "unknown"


def graded_event_id(interaction_id: str, revision: int) -> str:
    """Deterministic per (interaction, revision): a re-emission is recognisably the same record.
    Equal to `shared.contracts.events.deterministic_id("graded", interaction_id, str(revision))` (a uuid5),
    computed without building a uuid.UUID, because every emission needs one."""
    h = bytearray(hashlib.sha1(_UUID_NS + f"apprentice:graded/{interaction_id}/{revision}".encode()).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x50  # version 5
    h[8] = (h[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


_UUID_NS = uuid.NAMESPACE_URL.bytes


def judge_event_id(interaction_id: str, grader: str) -> str:
    return deterministic_id("judge", interaction_id, grader)


def encode_judge(interaction_id: str, grader: str, value: float, has_signal: bool, detail: str) -> bytes:
    return JUDGE + json.dumps({"event_id": judge_event_id(interaction_id, grader), "grader": grader,
                               "value": value, "has_signal": has_signal, "detail": detail}).encode()


class Joiner:
    def __init__(self, config: GraderConfig | RuleBook, stats: D.DetectorStats, *, retention_s: float,
                 orphan_feedback_s: float, source: str = "grader", limits: Limits | None = None) -> None:
        self.book = config if isinstance(config, RuleBook) else RuleBook(config)
        """The file's config plus the rules set at run time (rulebook.py); followed by rules_follower.py."""
        self._book_revision = self.book.revision
        self.unread: dict[tuple[str, str, str], int] = {}
        """(tenant, task, feedback kind) -> feedback events joined that no grader of the task reads."""
        self.limits = limits or Limits()
        self.stats = stats
        self.retention_s = retention_s
        self.orphan_feedback_s = orphan_feedback_s
        self.source = source
        self._tasks: dict[tuple[str, str], TaskGraders | None] = {}

    def task_for(self, interaction: events_pb2.Interaction) -> TaskGraders | None:
        return self.task_of(interaction.envelope.tenant, interaction.task)

    @property
    def config(self) -> GraderConfig:
        """The config in effect: the file's, with the runtime rules merged in."""
        return self.book.config

    def task_of(self, tenant: str, task: str) -> TaskGraders | None:
        """`config.for_task`, remembered until the runtime rules change."""
        if self._book_revision != self.book.revision:
            self._book_revision = self.book.revision
            self._tasks.clear()
        key = (tenant, task)
        if key not in self._tasks:
            if len(self._tasks) > 100_000:  # tenants x tasks is small; this only bounds a flood of junk
                self._tasks.clear()
            self._tasks[key] = self.config.for_task(tenant, task)
        return self._tasks[key]

    def due(self, state: PendingState) -> tuple[float, bool]:
        """(when a tick must next look at `state`, whether its feedback window is still open): the window
        end, then the end of retention; orphan feedback expires `orphan_feedback_s` after it arrived."""
        if state.interaction is None:
            return state.first_seen + self.orphan_feedback_s, False
        if not (state.closed and state.revision > 0):
            return state.deadline, True
        return max(state.deadline, state.emitted_at) + self.retention_s, False

    # --- events ------------------------------------------------------------------------------------
    def apply(self, state: PendingState | None, key: str, value: bytes, now: float, partition: int,
              parsed: events_pb2.Interaction | None = None) -> Step:
        """Apply one join item to the key's state. `parsed`: the item's interaction, already decoded
        (and validated) by the caller, to save decoding it twice."""
        kind, body = value[:1], value[1:]
        if kind not in KINDS:
            raise BadJoinRecord(f"unknown join record kind {kind!r}")
        if state is None:
            if kind == TICK:
                return Step(None, False, note="tick for a gone key")
            state = PendingState(interaction_id=key, partition=partition, first_seen=now)
        if kind == TICK:
            return self._tick(state, now)
        if kind == INTERACTION:
            return self._interaction(state, body, now, parsed)
        if kind == FEEDBACK:
            return self._feedback(state, body, now)
        return self._judge(state, body, now)

    def apply_guarded(self, state: PendingState | None, key: bytes, value: bytes, now: float,
                      partition: int, parsed: events_pb2.Interaction | None = None) -> Step | Rejected:
        """`apply`, with failures turned into a rejection for the dead-letter topic: an unreadable item
        (`grader.join`), or any other exception, such as a bug or a user verifier gone wrong
        (`grader.grade`), must not stop the stream. `state` must be the caller's own copy: on failure
        it may be half changed, and the caller keeps its previous state."""
        try:
            return self.apply(state, key.decode(), value, now, partition, parsed)
        except Refused as e:
            return Rejected(e.refusal.stage, e.refusal.reason, "Refused", e.tenant)
        except BadJoinRecord as e:
            return Rejected("grader.join", str(e), type(e).__name__)
        except Exception as e:  # noqa: BLE001 - see docstring
            log.exception("grading failed", extra={"interaction_id": key.decode(errors="replace")})
            return Rejected("grader.grade", f"{type(e).__name__}: {e}", type(e).__name__)

    def _interaction(self, state: PendingState, body: bytes, now: float,
                     parsed: events_pb2.Interaction | None) -> Step:
        it = parsed if parsed is not None else _parse(events_pb2.Interaction, body)
        if state.interaction is not None:
            # The same interaction id again: the first copy wins. From its own producer (a replay, under
            # the same or another event id) it is a duplicate; from another producer or tenant it is
            # refused, so that nobody can take over an id already in use.
            refusal = check_same_producer(events_pb2.Interaction.FromString(state.interaction), it)
            if refusal is not None:
                raise Refused(refusal, it.envelope.tenant)
            return Step(state, False, note="duplicate interaction")
        if state.has_seen(it.envelope.event_id):
            return Step(state, False, note="duplicate interaction")
        state.mark_seen(it.envelope.event_id)
        state.interaction = body
        refused = self._unpair(state, it)
        task = self.task_for(it)
        window = task.feedback_window_s if task is not None else 0.0
        occurred = it.envelope.occurred_at.ToMicroseconds() / 1e6 if it.envelope.HasField("occurred_at") else now
        state.deadline = occurred + window
        state.window = window
        state.tenant, state.task = it.envelope.tenant, it.task
        for raw in state.feedback:  # feedback that arrived before its interaction
            self._note_unread(it, events_pb2.FeedbackEvent.FromString(raw))
        step = self._decide(state, now, changed=True, interaction=it)
        step.refused = refused
        return step

    def _unpair(self, state: PendingState, it: events_pb2.Interaction) -> list[tuple[bytes, Rejected]]:
        """Feedback that arrived before `it` and does not belong to it (another tenant, too early): out of
        the state, to the dead-letter topic. Its event ids stay seen, so a replay of it changes nothing."""
        kept, refused = [], []
        for raw in state.feedback:
            fb = events_pb2.FeedbackEvent.FromString(raw)
            refusal = check_pairing(it, fb, self.limits)
            if refusal is None:
                kept.append(raw)
            else:
                refused.append((raw, Rejected(refusal.stage, refusal.reason, "Refused", fb.envelope.tenant or "unknown")))
        state.feedback = kept
        return refused

    def _feedback(self, state: PendingState, body: bytes, now: float) -> Step:
        fb = _parse(events_pb2.FeedbackEvent, body)
        if state.has_seen(fb.envelope.event_id):
            return Step(state, False, note="duplicate feedback")
        it = events_pb2.Interaction.FromString(state.interaction) if state.interaction is not None else None
        refusal = check_join(it, fb, len(body), state.feedback, self.limits)
        if refusal is not None:
            raise Refused(refusal, fb.envelope.tenant)
        state.mark_seen(fb.envelope.event_id)
        state.feedback.append(body)
        if it is not None:
            self._note_unread(it, fb)
        return self._decide(state, now, changed=True, interaction=it)

    def _note_unread(self, it: events_pb2.Interaction, fb: events_pb2.FeedbackEvent) -> None:
        """Count (and log once per tenant, task and kind) feedback that no grader of its task reads: it
        neither ends the wait nor changes the reward, which an operator must be able to see."""
        task = self.task_for(it)
        kind = feedback_kind(fb)
        if (task is not None and kind in reads(task)) or (fb.kind == "kpi" and fb.kpi_name in self.config.detectors.infra_kpis):
            return
        key = (it.envelope.tenant, it.task, kind)
        if key not in self.unread:
            if len(self.unread) > 10_000:
                self.unread.clear()
            log.warning("feedback that no grader of its task reads: it does not end the wait nor count in the "
                        "reward; set a rule with `apprentice grader rules set`",
                        extra={"tenant": key[0], "task": key[1], "kind": kind})
        self.unread[key] = self.unread.get(key, 0) + 1

    def _judge(self, state: PendingState, body: bytes, now: float) -> Step:
        try:
            r: dict[str, Any] = json.loads(body)
            event_id, grader = str(r["event_id"]), str(r["grader"])
        except (ValueError, KeyError, TypeError) as e:
            raise BadJoinRecord(f"unreadable judge result: {e}") from e
        if state.has_seen(event_id) or grader in state.judge:
            return Step(state, False, note="duplicate judge result")
        state.mark_seen(event_id)
        state.judge[grader] = {"value": float(r["value"]), "has_signal": bool(r["has_signal"]),
                               "detail": str(r.get("detail", ""))}
        return self._decide(state, now, changed=True)

    def _tick(self, state: PendingState, now: float) -> Step:
        if state.interaction is None:
            if now >= state.first_seen + self.orphan_feedback_s:
                log.warning("dropping feedback for an interaction that never arrived",
                            extra={"interaction_id": state.interaction_id, "feedback": len(state.feedback)})
                return Step(None, True, note="orphan feedback dropped")
            return Step(state, False)
        if state.closed and state.revision > 0:
            if now >= max(state.deadline, state.emitted_at) + self.retention_s:
                return Step(None, True, note="retention over")
            return Step(state, False)
        changed = self._rewindow(state)
        if now >= state.deadline:
            state.closed = True
            return self._decide(state, now, changed=True)
        # Early ticks come after a change of the runtime rules (the runtimes tick every open window then):
        # under the new rules the feedback already here may be complete.
        return self._decide(state, now, changed=changed)

    def _rewindow(self, state: PendingState) -> bool:
        """An open window follows its task's current window (a rule set at run time): the deadline moves by
        the difference. States written before windows were recorded (window < 0) keep their deadline."""
        if state.window < 0 or state.interaction is None:
            return False
        task = self.task_of(state.tenant, state.task)
        window = task.feedback_window_s if task is not None else 0.0
        if window == state.window:
            return False
        state.deadline += window - state.window
        state.window = window
        return True

    # --- the decision --------------------------------------------------------------------------
    def _decide(self, state: PendingState, now: float, *, changed: bool,
                interaction: events_pb2.Interaction | None = None) -> Step:
        if state.interaction is None:
            return Step(state, changed, note="waiting for the interaction")
        it = interaction or events_pb2.Interaction.FromString(state.interaction)
        task = self.task_for(it)
        if task is None:
            return Step(state, changed, note=f"no grader config for {it.envelope.tenant}/{it.task}")
        feedback = [events_pb2.FeedbackEvent.FromString(b) for b in state.feedback]
        infra = D.infra_failure(self.config.detectors, it, feedback)
        components = compute_components(task, it, feedback, state.judge)
        plan = plan_for(task)
        if state.revision == 0 and infra is None and not state.closed:
            if any(name not in state.judge for name in plan.judge_names):
                return Step(state, changed, note="waiting for the judge")
            if plan.waits_for_feedback and not feedback_complete(task, components):
                return Step(state, changed, note="waiting for feedback")
        state.closed = True
        record, digest = self._build(state, task, it, feedback, components, infra, now)
        if digest == state.digest:
            return Step(state, changed, note="content unchanged")
        state.revision += 1
        state.digest = digest
        state.emitted_at = now
        record.revision = state.revision
        record.envelope.event_id = graded_event_id(state.interaction_id, state.revision)
        self._flag(state, task, it, record)
        return Step(state, True, emit=record)

    def rebuild(self, state: PendingState, now: float) -> events_pb2.GradedInteraction | None:
        """The record of the state's current revision again (recovery re-sends one lost in a crash)."""
        if state.interaction is None or state.revision == 0:
            return None
        it = events_pb2.Interaction.FromString(state.interaction)
        task = self.task_for(it)
        if task is None:
            return None
        feedback = [events_pb2.FeedbackEvent.FromString(b) for b in state.feedback]
        components = compute_components(task, it, feedback, state.judge)
        infra = D.infra_failure(self.config.detectors, it, feedback)
        record, _ = self._build(state, task, it, feedback, components, infra, now)
        record.revision = state.revision
        record.envelope.event_id = graded_event_id(state.interaction_id, state.revision)
        self._flag(state, task, it, record, observe=False)
        return record

    def _build(self, state: PendingState, task: TaskGraders, it: events_pb2.Interaction,
               feedback: list[events_pb2.FeedbackEvent], components: list[events_pb2.RewardComponent],
               infra: str | None, now: float) -> tuple[events_pb2.GradedInteraction, str]:
        comb = combine(task, components)
        has_signal, reward, reason = comb.has_signal, comb.reward, ""
        if infra is not None:
            has_signal, reward, reason = False, 0.0, infra
        elif not has_signal:
            reason = "window_expired" if plan_for(task).needs_feedback else "no_grader_signal"
        envelope = common_pb2.Envelope(event_id="pending", tenant=it.envelope.tenant or "default",
                                       trace_id=it.envelope.trace_id or new_id(), source=self.source)
        envelope.occurred_at.seconds, envelope.occurred_at.nanos = _timestamp(now)
        record = events_pb2.GradedInteraction(
            envelope=envelope,
            interaction=it, reward=reward, has_signal=has_signal, components=components,
            feedback=feedback, no_signal_reason=reason, success=comb.success and infra is None,
            grader_config_version=self.book.version_of(it.envelope.tenant, it.task, task))
        if infra is not None:
            record.flags.append(infra)
        digest_src = _COMPACT_JSON.encode([round(reward, 9), has_signal, reason,
                                           [(c.name, round(c.value, 9), c.has_signal) for c in components],
                                           [f.envelope.event_id for f in feedback]])
        return record, hashlib.sha1(digest_src.encode()).hexdigest()

    def _flag(self, state: PendingState, task: TaskGraders, it: events_pb2.Interaction,
              record: events_pb2.GradedInteraction, *, observe: bool = True) -> None:
        """Detectors: count the interaction once in the rolling statistics, then flag the record."""
        cfg = self.config.detectors
        obs = D.Observation(tenant=it.envelope.tenant, task=it.task, policy_version=it.policy_version or "base",
                            length=len(it.response_token_ids) or len(it.response_text.split()),
                            reward=record.reward if record.has_signal else None,
                            truncated=it.finish_reason == "length", prompt_key=prompt_key(it),
                            reply_key=reply_digest(it.response_text))
        infra = bool(record.no_signal_reason in ("tool_timeout", "infra_failure"))
        if observe and not state.stats_counted and not infra:
            self.stats.observe(obs)
            state.stats_counted = True
        if infra:
            return
        for flag in D.detect(cfg, self.stats, task, obs, it.response_text, record.components):
            if flag not in record.flags:
                record.flags.append(flag)
        record.quarantined = D.quarantined(cfg, record.flags)


def prompt_key(it: events_pb2.Interaction) -> str:
    """The prompt as `constant_reply` tells prompts apart: a digest of its last user message ("" = none)."""
    last = next((m.content for m in reversed(it.messages) if m.role == "user"), "")
    return hashlib.sha1(last.encode("utf-8")).hexdigest()[:16] if last else ""


def reply_digest(text: str) -> str:
    """`reply_key(text)` as a short digest: the detector's window keeps 16 characters per reply, whatever its
    length ("" for a reply with no words)."""
    key = reply_key(text)
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:16] if key else ""


def feedback_kind(fb: events_pb2.FeedbackEvent) -> str:
    """`correction`, `thumbs`, `rating`, or `kpi:<name>`: what a grader must read to use `fb`."""
    return f"kpi:{fb.kpi_name}" if fb.kind == "kpi" else fb.kind


def reads(task: TaskGraders) -> frozenset[str]:
    """The feedback kinds (as `feedback_kind` spells them) some grader of `task` reads."""
    return plan_for(task).reads


def _timestamp(now: float) -> tuple[int, int]:
    """(seconds, nanos) of epoch time `now` at microsecond precision, rounded as `datetime.fromtimestamp`
    rounds (what `make_envelope` stored before), without building a datetime per record."""
    frac, whole = math.modf(now)
    micros = round(frac * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    return int(whole), micros * 1000


def _parse(msg_type: Any, body: bytes) -> Any:
    try:
        msg = msg_type.FromString(body)
    except DecodeError as e:
        raise BadJoinRecord(f"join record is not a {msg_type.DESCRIPTOR.name}: {e}") from e
    if not msg.envelope.event_id:
        raise BadJoinRecord(f"{msg_type.DESCRIPTOR.name} without envelope.event_id")
    return msg
