"""Judge groups (pure): complete groups are judged at once, stragglers wait, repeats change nothing."""

from __future__ import annotations

from services.grader.core.join import JUDGE, judge_event_id
from services.grader.core.judge import JudgeScore
from services.grader.core.judge_groups import JudgeGroup, add_member, due, judge_items
from shared.grading import parse_grader_config
from tests.helpers.grader import interaction

CONFIG = parse_grader_config({"version": "j-1", "tasks": [
    {"tenant": "demo", "task": "judged", "graders": [{"name": "j", "type": "judge", "rubric": "r", "group_wait_s": 7}]},
    {"tenant": "demo", "task": "solo", "graders": [{"name": "j", "type": "judge", "rubric": "r",
                                                    "group_relative": False}]},
    {"tenant": "demo", "task": "rules", "graders": [{"name": "n", "type": "regex", "pattern": "1"}]},
]})
JUDGED = CONFIG.for_task("demo", "judged")


def test_a_group_waits_for_its_members_then_is_judged_once() -> None:
    a, b = (interaction(task="judged", group_id="g", group_size=2) for _ in range(2))
    first = add_member(None, a, a.SerializeToString(), JUDGED, 100.0)
    assert first.changed and not first.ready and first.group is not None
    assert due(first.group, JUDGED) == 107.0
    again = add_member(first.group, a, a.SerializeToString(), JUDGED, 101.0)
    assert not again.changed and again.group is first.group  # the same member twice
    done = add_member(JudgeGroup.decode(first.group.encode()), b, b.SerializeToString(), JUDGED, 102.0)
    assert done.changed and done.group is None
    assert [m.interaction_id for m in done.ready] == [a.interaction_id, b.interaction_id]


def test_singles_and_non_relative_judges_are_judged_at_once_and_non_judged_tasks_ignored() -> None:
    one = interaction(task="judged")
    step = add_member(None, one, one.SerializeToString(), JUDGED, 1.0)
    assert [m.interaction_id for m in step.ready] == [one.interaction_id] and not step.changed
    solo = interaction(task="solo", group_id="g", group_size=4)
    assert len(add_member(None, solo, solo.SerializeToString(), CONFIG.for_task("demo", "solo"), 1.0).ready) == 1
    rules = interaction(task="rules")
    assert add_member(None, rules, b"", CONFIG.for_task("demo", "rules"), 1.0) == add_member(None, rules, b"", None, 1.0)
    assert not add_member(None, rules, b"", None, 1.0).changed


def test_group_codec_and_judge_items() -> None:
    g = JudgeGroup(12.5, [b"\x00\x01", b"abc"])
    assert JudgeGroup.decode(g.encode()) == g
    assert JUDGED is not None
    [(key, value)] = judge_items(JUDGED.judges[0], [JudgeScore("iid-1", 0.7, True, "judge 7/10")])
    assert key == b"iid-1" and value.startswith(JUDGE) and judge_event_id("iid-1", "j").encode() in value
