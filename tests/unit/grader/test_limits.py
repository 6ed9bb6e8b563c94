"""The grader's trust boundary (limits.py) through the join state machine and routing, no Kafka: feedback
joins only its own tenant's interaction, within caps and clock skew; an interaction id belongs to its first
producer; interaction ids must carry a valid MAC when the secret is configured."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.grader.core.detectors import DetectorStats
from services.grader.core.join import FEEDBACK, INTERACTION, Joiner, Refused, Rejected, Step
from services.grader.core.limits import (
    STAGE_IDENTITY,
    STAGE_LIMITS,
    STAGE_PRODUCER,
    STAGE_TENANT,
    STAGE_TIME,
    Limits,
    oversize,
)
from services.grader.core.routing import DEADLETTER_VALUE_MAX, dead_letter, route
from services.grader.core.state import PendingState
from shared.grading import parse_grader_config
from shared.proto.apprentice.v1 import events_pb2
from shared.security.interaction_ids import issue
from tests.helpers.grader import feedback, interaction

T0 = 1_800_000_000.0
CONFIG = parse_grader_config({"version": "l-1", "tasks": [
    {"tenant": "*", "task": "support", "feedback_window_s": 60,
     "graders": [{"name": "resolved", "type": "kpi", "kpi": "resolved", "map": {1: 1.0, 0: 0.0}},
                 {"name": "corrected", "type": "feedback", "kind": "correction", "weight": 0}]},
]})


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


class Harness:
    def __init__(self, limits: Limits | None = None) -> None:
        self.joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600,
                             limits=limits)
        self.raw: dict[str, bytes] = {}
        self.out: list[events_pb2.GradedInteraction] = []

    def send(self, key: str, value: bytes, now: float) -> Step | Rejected:
        before = self.raw.get(key)
        step = self.joiner.apply_guarded(PendingState.decode(before) if before else None, key.encode(), value, now, 1)
        if isinstance(step, Rejected):
            return step
        if step.changed:
            if step.state is None:
                self.raw.pop(key, None)
            else:
                self.raw[key] = step.state.encode()
        if step.emit is not None:
            self.out.append(step.emit)
        return step

    def interaction(self, it: events_pb2.Interaction, now: float = T0) -> Step | Rejected:
        return self.send(it.interaction_id, INTERACTION + it.SerializeToString(), now)

    def feedback(self, fb: events_pb2.FeedbackEvent, now: float) -> Step | Rejected:
        return self.send(fb.interaction_id, FEEDBACK + fb.SerializeToString(), now)


def test_feedback_from_another_tenant_is_refused_and_never_joined() -> None:
    h = Harness()
    it = interaction(tenant="tenant-a", occurred_at=at(T0))
    h.interaction(it)
    r = h.feedback(feedback(it.interaction_id, kind="correction", comment="mine now", tenant="tenant-b",
                            occurred_at=at(T0 + 1)), T0 + 1)
    assert isinstance(r, Rejected) and r.stage == STAGE_TENANT and r.tenant == "tenant-b"
    assert PendingState.decode(h.raw[it.interaction_id]).feedback == []
    step = h.feedback(feedback(it.interaction_id, value=1.0, tenant="tenant-a", occurred_at=at(T0 + 2)), T0 + 2)
    assert isinstance(step, Step) and step.emit is not None
    assert [f.envelope.tenant for f in step.emit.feedback] == ["tenant-a"]


def test_feedback_that_waited_for_its_interaction_is_dead_lettered_when_it_does_not_belong() -> None:
    h = Harness()
    it = interaction(tenant="tenant-a", occurred_at=at(T0))
    foreign = feedback(it.interaction_id, kind="correction", comment="x", tenant="tenant-b", occurred_at=at(T0))
    early = feedback(it.interaction_id, value=0.0, tenant="tenant-a", occurred_at=at(T0 - 3600))
    own = feedback(it.interaction_id, value=1.0, tenant="tenant-a", occurred_at=at(T0 + 1))
    for fb in (foreign, early, own):
        assert isinstance(h.feedback(fb, T0 - 10), Step)  # no interaction yet: nothing to check against
    step = h.interaction(it, T0 + 2)
    assert isinstance(step, Step) and step.emit is not None
    assert [(body, why.stage) for body, why in step.refused] == [(foreign.SerializeToString(), STAGE_TENANT),
                                                                  (early.SerializeToString(), STAGE_TIME)]
    assert [f.envelope.event_id for f in step.emit.feedback] == [own.envelope.event_id]
    assert step.emit.reward == 1.0
    # a replay of a refused event changes nothing (it is remembered as seen, not joined again)
    replay = h.feedback(foreign, T0 + 3)
    assert isinstance(replay, Step) and replay.note == "duplicate feedback"


def test_feedback_outside_the_clock_skew_of_its_interaction_is_refused() -> None:
    h = Harness(Limits(skew_s=60))
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    r = h.feedback(feedback(it.interaction_id, occurred_at=at(T0 - 61)), T0 + 1)
    assert isinstance(r, Rejected) and r.stage == STAGE_TIME and "before its interaction" in r.reason
    assert isinstance(h.feedback(feedback(it.interaction_id, occurred_at=at(T0 - 59)), T0 + 1), Step)
    limits = Limits(skew_s=60)
    future = feedback(it.interaction_id, occurred_at=at(T0 + 61)).SerializeToString()
    routed = route(False, future, lambda *_: None, limits=limits, now=T0)
    assert routed.rejected is not None and routed.rejected.stage == STAGE_TIME and "future" in routed.rejected.reason
    assert route(False, future, lambda *_: None, limits=limits, now=T0 + 2).rejected is None


def test_caps_on_count_bytes_and_comment_length_keep_the_state_bounded() -> None:
    h = Harness(Limits(max_feedback=3, max_feedback_bytes=2_000, max_comment_chars=500))
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    big = [feedback(it.interaction_id, kind="correction", comment=f"{i}" + "x" * 450, occurred_at=at(T0 + i))
           for i in range(6)]
    outcomes = [h.feedback(fb, T0 + 10) for fb in big]
    assert [isinstance(o, Step) for o in outcomes] == [True, True, True, False, False, False]
    assert {o.stage for o in outcomes if isinstance(o, Rejected)} == {STAGE_LIMITS}
    assert "already has 3 feedback events" in outcomes[3].reason  # type: ignore[union-attr]
    state = PendingState.decode(h.raw[it.interaction_id])
    assert len(state.feedback) == 3 and len(h.out) == 0  # the KPI never came: still waiting, still gradeable
    kpi = h.feedback(feedback(it.interaction_id, value=1.0, occurred_at=at(T0 + 20)), T0 + 20)
    assert isinstance(kpi, Rejected)  # the count cap holds for every kind
    h2 = Harness(Limits(max_feedback=30, max_feedback_bytes=2_000, max_comment_chars=500))
    h2.interaction(it)
    results = [h2.feedback(fb, T0 + 10) for fb in big]
    sizes = [len(fb.SerializeToString()) for fb in big]
    fits = max(k for k in range(7) if sum(sizes[:k]) <= 2_000)
    assert fits == 3 and [isinstance(o, Step) for o in results] == [True] * fits + [False] * (6 - fits)
    assert "would total" in results[fits].reason  # type: ignore[union-attr]
    # one comment over the limit is refused on its own, before any join
    long = feedback(it.interaction_id, kind="correction", comment="y" * 501).SerializeToString()
    r = route(False, long, lambda *_: None, limits=Limits(max_comment_chars=500))
    assert r.rejected is not None and r.rejected.stage == STAGE_LIMITS and "MAX_COMMENT_CHARS" in r.rejected.reason


def test_the_attack_of_70_long_corrections_leaves_a_small_state_and_a_graded_interaction() -> None:
    h = Harness()  # default limits
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    refused = 0
    for _ in range(70):
        fb = feedback(it.interaction_id, kind="correction", comment="z" * 20_000, occurred_at=at(T0 + 1))
        raw = fb.SerializeToString()
        assert route(False, raw, lambda *_: None, now=T0 + 1).rejected is None
        refused += isinstance(h.feedback(fb, T0 + 1), Rejected)
    assert refused == 70 - 6  # 128 KiB of feedback budget holds 6 of them
    assert len(h.raw[it.interaction_id]) < Limits().max_record_bytes // 4
    closed = h.send(it.interaction_id, b"T", T0 + 61)  # the window ends: graded, with what joined
    assert isinstance(closed, Step) and closed.emit is not None and len(closed.emit.feedback) == 6


def test_an_interaction_id_belongs_to_its_first_producer() -> None:
    h = Harness()
    it = interaction(tenant="tenant-a", occurred_at=at(T0))
    it.envelope.source = "inference/pod-1"
    it.envelope.principal.key_id = "svc-inference"
    assert isinstance(h.interaction(it), Step)
    replay = events_pb2.Interaction()
    replay.CopyFrom(it)
    replay.envelope.event_id = "another-event-id"  # the same producer re-sending after a crash
    assert isinstance(h.interaction(replay, T0 + 1), Step)
    for change in ({"source": "somebody-else"}, {"tenant": "tenant-b"}, {"key_id": "backend-b"}):
        rival = events_pb2.Interaction()
        rival.CopyFrom(it)
        rival.response_text = "a different answer"
        if "key_id" in change:
            rival.envelope.principal.key_id = change["key_id"]
        else:
            setattr(rival.envelope, *next(iter(change.items())))
        r = h.interaction(rival, T0 + 2)
        assert isinstance(r, Rejected) and r.stage == STAGE_PRODUCER, change
    assert events_pb2.Interaction.FromString(PendingState.decode(h.raw[it.interaction_id]).interaction or b"") == it


def test_interaction_ids_must_verify_for_their_tenant_when_the_secret_is_set() -> None:
    secret = b"k" * 32
    limits = Limits(id_secret=secret)
    good = issue("tenant-a", secret)
    it = interaction(tenant="tenant-a", interaction_id=good)
    assert route(True, it.SerializeToString(), lambda *_: CONFIG.tasks[0], limits=limits).rejected is None
    for fb in (feedback(good, tenant="tenant-b"), feedback("0" * 32 + ".forged", tenant="tenant-a"),
               feedback("unsigned-id", tenant="tenant-a")):
        r = route(False, fb.SerializeToString(), lambda *_: None, limits=limits).rejected
        assert r is not None and r.stage == STAGE_IDENTITY, fb.interaction_id
    assert route(False, feedback(good, tenant="tenant-a").SerializeToString(), lambda *_: None,
                 limits=limits).rejected is None
    stolen = interaction(tenant="tenant-b", interaction_id=good)
    r = route(True, stolen.SerializeToString(), lambda *_: CONFIG.tasks[0], limits=limits).rejected
    assert r is not None and r.stage == STAGE_IDENTITY
    # without a secret, ids are not checked (development)
    assert route(False, feedback("unsigned-id").SerializeToString(), lambda *_: None).rejected is None


def test_records_that_cannot_be_written_are_refused_before_kafka_sees_them() -> None:
    limits = Limits(max_record_bytes=200_000, max_feedback_bytes=16_000)
    huge = interaction(text="w " * 70_000)  # ~140 kB + token ids: over 200 kB - 16 kB - 64 kB
    r = route(True, huge.SerializeToString(), lambda *_: CONFIG.tasks[0], limits=limits).rejected
    assert r is not None and r.stage == STAGE_LIMITS and "exceeds the grader's limit" in r.reason
    assert oversize(200_001, None, limits) is not None and oversize(10, None, limits) is None
    g = events_pb2.GradedInteraction(interaction=huge)
    assert oversize(10, g, limits) is not None


def test_dead_letters_carry_at_most_a_bounded_copy_of_the_record() -> None:
    value = b"v" * (DEADLETTER_VALUE_MAX + 10)
    dl = dead_letter(Rejected("grader.limits", "too big", "Refused"), source="grader", topic="t", partition=0,
                     offset=1, key=b"k" * 5000, value=value)
    assert len(dl.original_value) == DEADLETTER_VALUE_MAX and len(dl.original_key) == 4096
    assert "cut from" in dl.reason


def test_refusals_raise_from_apply_and_leave_the_callers_state_alone() -> None:
    h = Harness()
    it = interaction(tenant="tenant-a", occurred_at=at(T0))
    h.interaction(it)
    state = PendingState.decode(h.raw[it.interaction_id])
    with pytest.raises(Refused):
        h.joiner.apply(state.copy(), it.interaction_id,
                       FEEDBACK + feedback(it.interaction_id, tenant="tenant-b").SerializeToString(), T0 + 1, 1)
    assert PendingState.decode(h.raw[it.interaction_id]) == state
