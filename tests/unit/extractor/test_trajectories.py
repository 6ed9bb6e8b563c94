"""Sessions --> multi-turn trajectories: revisions, outcome, feedback, grouping, pending offsets; the prompt."""

from __future__ import annotations

from services.extractor.prompt import MARKER, NO_PREVIOUS, build_prompt
from services.extractor.trajectories import SessionBuffer, Trajectory, knowledge_key
from tests.unit.extractor.factories import graded


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_key_defaults() -> None:
    assert knowledge_key("acme", "support") == "acme/support"
    assert knowledge_key("", "  ") == "default/general"


def test_multi_turn_session_closes_after_the_gap_with_rounds_in_order() -> None:
    clock = Clock()
    buf = SessionBuffer(gap_s=10, max_turns=8, clock=clock)
    buf.add(graded(iid="i2", question="And for batteries?", answer="Six months.", at_s=5,
                   history=[("How long is the warranty?", "One year.")], has_signal=False, reward=0.0),
            topic="g", partition=0, offset=11)
    buf.add(graded(iid="i1", at_s=0, success=True, reward=1.0), topic="g", partition=0, offset=10)
    assert buf.ready() == []                       # still open
    clock.t += 10
    [(traj, offsets)] = buf.ready()
    assert [t.interaction_id for t in traj.turns] == ["i1", "i2"]   # by interaction time, not arrival
    assert traj.turns[1].input_text == "And for batteries?"            # only the new input of round 2
    assert traj.key == "acme/support" and offsets == {("g", 0, 10), ("g", 0, 11)}
    assert traj.success is True and traj.reward == 1.0                  # last judged turn (i1)


def test_highest_revision_wins_and_late_correction_is_the_feedback() -> None:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    buf.add(graded(revision=2, correction="24 months", reward=-1.0))
    buf.add(graded(revision=1, has_signal=False, reward=0.0))           # older revision arrives late
    [(traj, _)] = buf.ready()
    [turn] = traj.turns
    assert turn.revision == 2 and turn.corrections == ("24 months",)
    assert traj.success is False
    assert any("24 months" in line for line in traj.feedback)


def test_quarantined_turn_has_no_signal_and_correction_alone_means_failure() -> None:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    buf.add(graded(quarantined=True, success=True, reward=1.0, correction="Say 24 months."))
    [(traj, _)] = buf.ready()
    assert not traj.turns[0].has_signal
    assert traj.success is False and traj.informative


def test_no_signal_at_all_is_not_informative() -> None:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    buf.add(graded(has_signal=False, reward=0.0))
    [(traj, _)] = buf.ready()
    assert traj.success is None and not traj.informative


def test_group_samples_are_separate_trajectories_and_tenants_domains_split() -> None:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    buf.add(graded(iid="a", group=("g1", 0, 2)))
    buf.add(graded(iid="b", group=("g1", 1, 2)))
    buf.add(graded(iid="c", task=""))
    buf.add(graded(iid="d", tenant="other"))
    keys = sorted((t.key, len(t.turns)) for t, _ in buf.ready())
    assert keys == [("acme/general", 1), ("acme/support", 1), ("acme/support", 1), ("other/support", 1)]


def test_max_turns_closes_early_and_safe_offsets_never_pass_an_open_session() -> None:
    buf = SessionBuffer(gap_s=1000, max_turns=2)
    buf.add(graded(session="open", iid="o1"), topic="g", partition=0, offset=5)
    buf.add(graded(session="full", iid="f1"), topic="g", partition=0, offset=6)
    buf.add(graded(session="full", iid="f2"), topic="g", partition=0, offset=7)
    buf.note_consumed("g", 1, 3)                                       # a dead-lettered record elsewhere
    ready = buf.ready()
    assert [t.session_id for t, _ in ready] == ["full"]
    assert buf.safe_offsets() == {("g", 0): 5, ("g", 1): 4}
    buf.release([t for t, _ in ready])
    assert buf.safe_offsets()[("g", 0)] == 5                           # "open" still pins offset 5
    buf.release([t for t, _ in buf.ready(flush_all=True)])
    assert buf.safe_offsets() == {("g", 0): 8, ("g", 1): 4}


def test_trajectory_identity_and_seed_are_deterministic() -> None:
    def make() -> Trajectory:
        buf = SessionBuffer(gap_s=0, max_turns=8)
        buf.add(graded(iid="x", revision=3))
        return buf.ready()[0][0]
    a, b = make(), make()
    assert a.trajectory_id == b.trajectory_id and a.seed == b.seed > 0


def test_prompt_has_rounds_result_feedback_and_previous_knowledge() -> None:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    buf.add(graded(iid="i1", at_s=0, success=False, reward=-1.0, correction="24 months"))
    buf.add(graded(iid="i2", at_s=1, question="Thanks", answer="You're welcome", has_signal=False, reward=0.0,
                   history=[("How long is the warranty?", "One year.")]))
    [(traj, _)] = buf.ready()
    [msg] = build_prompt(traj, ["Returns need form R-12."])
    text = msg["content"]
    assert msg["role"] == "user"
    for part in ("Round1_Input: How long is the warranty?", "Round1_Output: One year.", "Round2_Input: Thanks",
                 "Round2_Output: You're welcome", "Final Result: Failure (reward -1.00)", '"24 months"',
                 f"{MARKER} Returns need form R-12.", "1-2 concise, general experience items"):
        assert part in text, part
    assert NO_PREVIOUS in build_prompt(traj, [])[0]["content"]


def test_prompt_budget_drops_old_knowledge_then_old_rounds() -> None:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    for i in range(4):
        buf.add(graded(iid=f"i{i}", at_s=i, question=f"question {i} " + "x" * 400, answer="y" * 400))
    [(traj, _)] = buf.ready()
    previous = [f"old rule number {i} " + "z" * 100 for i in range(20)]
    text = build_prompt(traj, previous, max_prompt_chars=3000)[0]["content"]
    assert len(text) <= 3000
    assert "old rule number" not in text and "question 3" in text and "question 0" not in text
