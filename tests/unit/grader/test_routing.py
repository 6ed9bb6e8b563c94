"""Source records --> join / judge items or rejections (pure), and the dead letters built from rejections."""

from __future__ import annotations

from services.grader.core.join import FEEDBACK, INTERACTION, Rejected
from services.grader.core.routing import dead_letter, route
from shared.grading import parse_grader_config
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import feedback, interaction

CONFIG = parse_grader_config({"version": "r-1", "tasks": [
    {"tenant": "demo", "task": "rules", "graders": [{"name": "num", "type": "regex", "pattern": "[0-9]"}]},
    {"tenant": "demo", "task": "judged", "graders": [{"name": "j", "type": "judge", "rubric": "be right"}]},
]})


def task_of(tenant: str, task: str):  # type: ignore[no-untyped-def]
    return CONFIG.for_task(tenant, task)


def test_interaction_becomes_a_join_item_keyed_by_interaction_id() -> None:
    it = interaction(task="rules")
    raw = it.SerializeToString()
    r = route(True, raw, task_of)
    assert r.rejected is None and r.judge is None
    assert r.join == (it.interaction_id.encode(), INTERACTION + raw)
    assert r.interaction is not None and r.interaction.interaction_id == it.interaction_id


def test_judged_interaction_also_goes_to_its_group() -> None:
    grouped = interaction(task="judged", group_id="g-7", group_size=2)
    single = interaction(task="judged")
    assert route(True, grouped.SerializeToString(), task_of).judge == (b"g-7", INTERACTION + grouped.SerializeToString())
    assert route(True, single.SerializeToString(), task_of).judge[0] == single.interaction_id.encode()  # type: ignore[index]


def test_feedback_is_keyed_by_the_interaction_it_is_about() -> None:
    fb = feedback("iid-9", kind="thumbs")
    r = route(False, fb.SerializeToString(), task_of)
    assert r.join == (b"iid-9", FEEDBACK + fb.SerializeToString()) and r.rejected is None


def test_rejections_name_stage_and_reason() -> None:
    bad = route(True, b"\xff\x00 not protobuf", task_of).rejected
    assert bad is not None and bad.stage == "grader.decode"
    unconfigured = route(True, interaction(task="nope").SerializeToString(), task_of).rejected
    assert unconfigured == Rejected("grader.config", "no grader configured for tenant 'demo' task 'nope'",
                                    "NoGraderConfig", "demo")
    orphan = route(False, events_pb2.FeedbackEvent(interaction_id="x").SerializeToString(), task_of).rejected
    assert orphan is not None and "without envelope" in orphan.reason
    no_id = feedback("", kind="thumbs")
    assert route(False, no_id.SerializeToString(), task_of).rejected.reason == "FeedbackEvent without interaction_id"  # type: ignore[union-attr]
    assert route(True, None, task_of).rejected.reason == "record has no value (tombstone)"  # type: ignore[union-attr]


def test_dead_letter_keeps_the_origin() -> None:
    dl = dead_letter(Rejected("grader.decode", "r" * 3000, "UndecodableEvent"), source="grader", topic="t",
                     partition=3, offset=42, key=b"k", value=b"v")
    assert (dl.stage, dl.error_type, dl.origin_topic, dl.origin_partition, dl.origin_offset) == \
        ("grader.decode", "UndecodableEvent", "t", 3, 42)
    assert (dl.original_key, dl.original_value, len(dl.reason), dl.envelope.tenant) == (b"k", b"v", 2000, "unknown")


def test_records_of_the_wrong_type_or_with_bad_values_are_refused_as_invalid() -> None:
    it = interaction(task="rules")
    wrong = route(True, it.SerializeToString(), task_of, [("apprentice-type", b"apprentice.v1.FeedbackEvent")])
    assert wrong.rejected is not None and wrong.rejected.stage == "grader.validate"
    assert wrong.rejected.error_type == "InvalidEvent"
    fb_as_interaction = route(True, feedback(it.interaction_id, kind="rating", value=4).SerializeToString(), task_of)
    assert fb_as_interaction.rejected is not None and "wrong wire type" in fb_as_interaction.rejected.reason
    nan = route(False, feedback(it.interaction_id, kind="rating", value=float("nan")).SerializeToString(), task_of)
    assert nan.rejected is not None and nan.rejected.stage == "grader.validate" and "nan" in nan.rejected.reason
    ok = route(True, it.SerializeToString(), task_of, [("apprentice-type", b"apprentice.v1.Interaction")])
    assert ok.rejected is None and ok.join is not None
