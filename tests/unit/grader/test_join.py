"""The join state machine (pure): timing, revisions, idempotency, masking, expiry, retention, recovery rebuild."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.grader.core.bundles import BadJoinRecord, decode_bundle, encode_bundle
from services.grader.core.detectors import DetectorStats
from services.grader.core.join import (
    FEEDBACK,
    INTERACTION,
    TICK,
    Joiner,
    Step,
    encode_judge,
    graded_event_id,
)
from services.grader.core.state import PendingState
from shared.grading import parse_grader_config
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import feedback, interaction

T0 = 1_800_000_000.0
CONFIG = parse_grader_config({"version": "cfg-7", "tasks": [
    {"tenant": "demo", "task": "support", "feedback_window_s": 60,
     "graders": [{"name": "resolved", "type": "kpi", "kpi": "resolved", "map": {1: 1.0, 0: 0.0}, "success": True},
                 {"name": "corrected", "type": "feedback", "kind": "correction", "weight": 0}]},
    {"tenant": "demo", "task": "rules", "graders": [{"name": "num", "type": "regex", "pattern": "[0-9]+"}]},
    {"tenant": "demo", "task": "judged", "graders": [
        {"name": "j", "type": "judge", "rubric": "be right"}, {"name": "num", "type": "regex", "pattern": "[0-9]"}]},
]})


class Harness:
    """Feeds items through a Joiner the way the grade stage does, re-encoding the state each time."""

    def __init__(self) -> None:
        self.joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
        self.raw: dict[str, bytes] = {}
        self.out: list[events_pb2.GradedInteraction] = []

    def send(self, key: str, value: bytes, now: float) -> Step:
        state = PendingState.decode(self.raw[key]) if key in self.raw else None
        step = self.joiner.apply(state, key, value, now, partition=3)
        if step.changed:
            if step.state is None:
                self.raw.pop(key, None)
            else:
                self.raw[key] = step.state.encode()
        if step.emit is not None:
            self.out.append(step.emit)
        return step

    def interaction(self, it: events_pb2.Interaction, now: float = T0) -> Step:
        return self.send(it.interaction_id, INTERACTION + it.SerializeToString(), now)

    def feedback(self, fb: events_pb2.FeedbackEvent, now: float) -> Step:
        """`fb` as sent at `now`: its occurred_at is `now` (T0 lies in the future of the test's clock, and
        feedback may not precede its interaction)."""
        fb.envelope.occurred_at.FromMicroseconds(int(now * 1e6))
        return self.send(fb.interaction_id, FEEDBACK + fb.SerializeToString(), now)


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def test_immediate_graders_emit_at_once_with_deterministic_id() -> None:
    h = Harness()
    it = interaction(task="rules", text="24 months", occurred_at=at(T0))
    step = h.interaction(it)
    assert step.emit is not None
    g = step.emit
    assert (g.revision, g.reward, g.has_signal, g.grader_config_version) == (1, 1.0, True, "cfg-7")
    assert g.envelope.event_id == graded_event_id(it.interaction_id, 1)
    assert g.interaction.interaction_id == it.interaction_id and g.envelope.tenant == "demo"
    assert g.envelope.trace_id == it.envelope.trace_id


def test_feedback_within_window_is_joined() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    assert h.interaction(it).emit is None  # waits for the KPI
    step = h.feedback(feedback(it.interaction_id, value=1.0), T0 + 5)
    assert step.emit is not None
    assert (step.emit.revision, step.emit.reward, step.emit.has_signal, step.emit.success) == (1, 1.0, True, True)
    assert [c.name for c in step.emit.components] == ["resolved", "corrected"]
    assert len(step.emit.feedback) == 1


def test_window_expiry_without_feedback_is_no_signal_then_late_feedback_revises() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    assert h.send(it.interaction_id, TICK, T0 + 30).emit is None  # not due yet
    expired = h.send(it.interaction_id, TICK, T0 + 61).emit
    assert expired is not None
    assert (expired.revision, expired.has_signal, expired.no_signal_reason) == (1, False, "window_expired")
    late = h.feedback(feedback(it.interaction_id, value=0.0), T0 + 3600).emit
    assert late is not None and (late.revision, late.has_signal, late.reward) == (2, True, 0.0)
    assert late.envelope.event_id == graded_event_id(it.interaction_id, 2)
    # a correction after that: revision 3 carries its text (weight 0: reward unchanged)
    corr = h.feedback(feedback(it.interaction_id, kind="correction", comment="The form is FORM-7", value=-1),
                      T0 + 3700).emit
    assert corr is not None and corr.revision == 3 and corr.reward == 0.0
    assert any(f.comment == "The form is FORM-7" for f in corr.feedback)


def test_duplicates_change_nothing() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    fb = feedback(it.interaction_id, value=1.0)
    h.interaction(it)
    h.feedback(fb, T0 + 1)
    before = dict(h.raw)
    assert h.interaction(it, T0 + 2).note == "duplicate interaction"
    assert h.feedback(fb, T0 + 3).note == "duplicate feedback"
    # same interaction id under a new event id is still the same interaction
    again = events_pb2.Interaction()
    again.CopyFrom(it)
    again.envelope.event_id = "other"
    assert not h.interaction(again, T0 + 4).changed
    assert h.raw == before and len(h.out) == 1


def test_unchanged_content_emits_no_revision() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    h.feedback(feedback(it.interaction_id, value=1.0), T0 + 1)
    assert h.send(it.interaction_id, TICK, T0 + 61).emit is None  # expiry after completion: nothing new
    assert len(h.out) == 1


@pytest.mark.parametrize(("kw", "reason"), [
    ({"finish_reason": "error"}, "infra_failure"),
    ({"messages": [("user", "look it up"), ("tool", "ERROR: lookup timed out after 30s")]}, "tool_timeout"),
])
def test_infra_failures_are_masked_at_once(kw: dict, reason: str) -> None:
    h = Harness()
    step = h.interaction(interaction(occurred_at=at(T0), **kw))
    assert step.emit is not None
    assert (step.emit.has_signal, step.emit.reward, step.emit.no_signal_reason) == (False, 0.0, reason)
    assert reason in step.emit.flags and not step.emit.quarantined


def test_infra_kpi_masks_a_pending_interaction() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    step = h.feedback(feedback(it.interaction_id, kpi_name="tool_timeout", value=1), T0 + 2)
    assert step.emit is not None and step.emit.no_signal_reason == "tool_timeout" and not step.emit.has_signal


def test_feedback_before_interaction_waits_then_orphans_expire() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    assert h.feedback(feedback(it.interaction_id, value=1.0), T0).emit is None
    step = h.interaction(it, T0 + 1)
    assert step.emit is not None and step.emit.reward == 1.0
    lone = feedback("never-arrives", value=1.0)
    h.feedback(lone, T0)
    assert h.send("never-arrives", TICK, T0 + 10).state is not None
    gone = h.send("never-arrives", TICK, T0 + 601)
    assert gone.state is None and gone.changed and "never-arrives" not in h.raw


def test_retention_deletes_the_state() -> None:
    h = Harness()
    it = interaction(task="rules", text="1", occurred_at=at(T0))
    h.interaction(it)
    # retention counts from the end of the window (default 300 s) or the last emission, whichever is later
    assert h.send(it.interaction_id, TICK, T0 + 3800).state is not None
    assert h.send(it.interaction_id, TICK, T0 + 3901).state is None
    assert h.send(it.interaction_id, TICK, T0 + 3902).note == "tick for a gone key"


def test_judge_result_completes_a_judged_task_once() -> None:
    h = Harness()
    it = interaction(task="judged", text="42", occurred_at=at(T0))
    assert h.interaction(it).emit is None  # waits for the judge
    step = h.send(it.interaction_id, encode_judge(it.interaction_id, "j", 0.7, True, "judge 7/10"), T0 + 2)
    assert step.emit is not None
    assert step.emit.reward == pytest.approx((0.7 + 1.0) / 2)
    dup = h.send(it.interaction_id, encode_judge(it.interaction_id, "j", 0.1, True, "second call"), T0 + 3)
    assert dup.note == "duplicate judge result" and len(h.out) == 1


def test_rebuild_reproduces_the_current_revision() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    first = h.feedback(feedback(it.interaction_id, value=1.0), T0 + 1).emit
    state = PendingState.decode(h.raw[it.interaction_id])
    again = h.joiner.rebuild(state, T0 + 99)
    assert again is not None and first is not None
    assert again.envelope.event_id == first.envelope.event_id
    assert (again.revision, again.reward, list(again.components)) == (first.revision, first.reward,
                                                                       list(first.components))


def test_bad_items_raise_bad_join_record() -> None:
    h = Harness()
    with pytest.raises(BadJoinRecord):
        h.send("k", b"Xjunk", T0)
    with pytest.raises(BadJoinRecord):
        h.send("k", INTERACTION + b"\xff\xff\xff", T0)
    with pytest.raises(BadJoinRecord):
        h.send("k", b"J{not json", T0)


def test_bundle_roundtrip_and_truncation() -> None:
    items = [(b"a", b"I123"), (b"bb", b""), (b"c" * 300, b"F" + bytes(range(256)))]
    assert decode_bundle(encode_bundle(items)) == items
    with pytest.raises(BadJoinRecord):
        decode_bundle(encode_bundle(items)[:-5])
    with pytest.raises(BadJoinRecord):
        decode_bundle(b"garbage")


def test_fast_murmur2_matches_kafkas() -> None:
    import random

    from aiokafka.partitioner import murmur2 as reference

    from services.grader.core.bundles import murmur2

    rng = random.Random(7)
    for n in range(70):
        for _ in range(20):
            data = bytes(rng.randrange(256) for _ in range(n))
            assert murmur2(data) == reference(data)


def test_graded_event_id_is_the_shared_uuid5() -> None:
    from shared.contracts.events import deterministic_id

    for iid in ("3f0b1c5e-8f0a-4c1e-9d7e-1b2c3d4e5f60", "", "ünï/cödé", "x" * 300):
        for rev in (1, 2, 17):
            assert graded_event_id(iid, rev) == deterministic_id("graded", iid, str(rev))


def test_record_timestamps_round_like_datetime() -> None:
    import random

    from services.grader.core.join import _timestamp
    from shared.contracts.events import make_envelope

    rng = random.Random(3)
    for now in [T0, T0 + 0.9999996, T0 + 0.0000004] + [rng.uniform(1.7e9, 1.9e9) for _ in range(2000)]:
        env = make_envelope("t", source="s", occurred_at=datetime.fromtimestamp(now, UTC))
        assert (env.occurred_at.seconds, env.occurred_at.nanos) == _timestamp(now)


def test_due_times_follow_the_state() -> None:
    h = Harness()
    it = interaction(occurred_at=at(T0))
    h.interaction(it)
    st = PendingState.decode(h.raw[it.interaction_id])
    assert h.joiner.due(st) == (T0 + 60, True)  # the window
    h.feedback(feedback(it.interaction_id, value=1.0), T0 + 5)
    st = PendingState.decode(h.raw[it.interaction_id])
    assert h.joiner.due(st) == (T0 + 60 + 3600, False)  # retention after the window
    lone = PendingState("orphan", first_seen=T0)
    assert h.joiner.due(lone) == (T0 + 600, False)


def test_bundles_are_split_to_stay_under_the_record_limit() -> None:
    from services.grader.core.bundles import encode_bundles

    items = [(f"k{i}".encode(), b"I" + b"x" * 3000) for i in range(100)]
    bundles = encode_bundles(items, 20_000)
    assert len(bundles) > 1 and all(len(b) <= 20_000 for b in bundles)
    assert [item for b in bundles for item in decode_bundle(b)] == items
    assert encode_bundles([(b"k", b"I" + b"y" * 50_000)], 20_000) == [encode_bundle([(b"k", b"I" + b"y" * 50_000)])]
