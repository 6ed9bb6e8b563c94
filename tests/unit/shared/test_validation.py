"""Record bytes + headers --> a checked event, or the reason it is refused (shared/contracts/validation.py)."""

from __future__ import annotations

import pytest

from shared.contracts.events import UndecodableEvent, make_envelope
from shared.contracts.validation import (
    TYPE_HEADER,
    InvalidEvent,
    decode_record,
    header_type,
    type_headers,
    type_headers_for_topic,
)
from shared.proto.apprentice.v1 import common_pb2, events_pb2
from tests.helpers.grader import feedback, interaction

NAN, INF = float("nan"), float("inf")


def refused(msg_type: type, value: bytes, headers: list | None = None) -> str:
    with pytest.raises(InvalidEvent) as e:
        decode_record(msg_type, value, headers)
    return str(e.value)


def test_valid_events_pass_with_or_without_their_type_header() -> None:
    it = interaction(n_tokens=300)
    raw = it.SerializeToString()
    assert decode_record(events_pb2.Interaction, raw, type_headers(it)) == it
    assert decode_record(events_pb2.Interaction, raw, None) == it  # an outside producer without headers
    assert decode_record(events_pb2.Interaction, raw, [("other", b"x")]) == it
    fb = feedback(it.interaction_id, kind="rating", value=4)
    assert decode_record(events_pb2.FeedbackEvent, fb.SerializeToString(), {TYPE_HEADER: b"apprentice.v1.FeedbackEvent"}) == fb


def test_a_header_naming_another_type_is_refused_even_when_the_bytes_parse() -> None:
    it = interaction()
    reason = refused(events_pb2.Interaction, it.SerializeToString(), type_headers(events_pb2.FeedbackEvent))
    assert "apprentice.v1.FeedbackEvent" in reason and "carries apprentice.v1.Interaction" in reason
    with pytest.raises(InvalidEvent, match="conflicting"):
        header_type([(TYPE_HEADER, b"apprentice.v1.Interaction"), (TYPE_HEADER, b"apprentice.v1.FeedbackEvent")])


def test_another_message_without_a_header_is_refused_by_its_wire_types_or_its_shape() -> None:
    # A FeedbackEvent's value (a double) lands on Interaction.task (a string): wrong wire type.
    rating = feedback("i-1", kind="rating", value=5).SerializeToString()
    assert "wrong wire type" in refused(events_pb2.Interaction, rating)
    # With value 0 nothing collides, but it has neither prompt nor response.
    correction = feedback("i-1", kind="correction", value=0, comment="It is 24 months.").SerializeToString()
    assert "needs a prompt or a response" in refused(events_pb2.Interaction, correction)
    # An Interaction on the feedback topic: its session id is no feedback kind, its task a string on a double.
    assert refused(events_pb2.FeedbackEvent, interaction().SerializeToString())


@pytest.mark.parametrize(("kind", "value", "why"), [
    ("rating", NAN, "FeedbackEvent.value is nan"),
    ("rating", INF, "FeedbackEvent.value is inf"),
    ("kpi", -INF, "FeedbackEvent.value is -inf"),
    ("rating", 0.0, "within [1, 5]"),
    ("rating", 6.0, "within [1, 5]"),
    ("thumbs", 0.5, "+1 or -1"),
    ("maybe", 1.0, "kind must be one of"),
])
def test_feedback_values_out_of_range_are_refused(kind: str, value: float, why: str) -> None:
    assert why in refused(events_pb2.FeedbackEvent, feedback("i-1", kind=kind, value=value).SerializeToString())


def test_non_finite_numbers_are_refused_at_any_depth_with_their_path() -> None:
    it = interaction(n_tokens=300)
    it.response_logprobs_t1[211] = NAN
    assert "Interaction.response_logprobs_t1[211] is nan" in refused(events_pb2.Interaction, it.SerializeToString())
    short = interaction(n_tokens=3)
    short.response_logprobs[1] = -INF
    assert "response_logprobs[1] is -inf" in refused(events_pb2.Interaction, short.SerializeToString())
    slow = interaction()
    slow.latency_ms = NAN
    assert "latency_ms is nan" in refused(events_pb2.Interaction, slow.SerializeToString())
    g = events_pb2.GradedInteraction(envelope=make_envelope("demo", source="t"), interaction=interaction(),
                                     revision=1, reward=0.5,
                                     components=[events_pb2.RewardComponent(name="r", value=INF, weight=1)])
    assert "GradedInteraction.components[0].value is inf" in refused(events_pb2.GradedInteraction,
                                                                     g.SerializeToString())
    g.components[0].value = 0.5
    g.feedback.append(feedback("i", kind="rating", value=NAN))
    assert "GradedInteraction.feedback[0].value is nan" in refused(events_pb2.GradedInteraction, g.SerializeToString())
    ck = events_pb2.CheckpointPublished(envelope=make_envelope("demo", source="t"), model="m", version="v2",
                                        metrics={"eval_reward": NAN})
    assert "metrics['eval_reward'] is nan" in refused(events_pb2.CheckpointPublished, ck.SerializeToString())


def test_interaction_ranges() -> None:
    it = interaction(n_tokens=200)
    it.response_logprobs[5] = 0.7
    assert "response_logprobs holds 0.7" in refused(events_pb2.Interaction, it.SerializeToString())
    it = interaction(n_tokens=4)
    it.latency_ms = -1
    assert "latency_ms must be >= 0" in refused(events_pb2.Interaction, it.SerializeToString())
    it = interaction(n_tokens=4)
    del it.response_logprobs[-1]
    assert "3 entries for 4 response tokens" in refused(events_pb2.Interaction, it.SerializeToString())
    it = interaction()
    it.sampling.CopyFrom(common_pb2.SamplingParams(top_p=1.5))
    assert "top_p" in refused(events_pb2.Interaction, it.SerializeToString())
    it = interaction()
    it.envelope.occurred_at.seconds = -5
    assert "timestamp out of range" in refused(events_pb2.Interaction, it.SerializeToString())


def test_model_update_ranges() -> None:
    up = events_pb2.ModelUpdate(envelope=make_envelope("demo", source="t"), model="m", version="v2",
                                action=events_pb2.UPDATE_ACTION_CANARY, canary_fraction=0.1)
    assert decode_record(events_pb2.ModelUpdate, up.SerializeToString()) == up
    up.canary_fraction = 3.0
    assert "canary_fraction" in refused(events_pb2.ModelUpdate, up.SerializeToString())
    up.canary_fraction, up.action = 0.1, 7  # type: ignore[assignment]  # an enum value no producer knows
    assert "unknown action 7" in refused(events_pb2.ModelUpdate, up.SerializeToString())


def test_invalid_events_are_undecodable_events_so_existing_handlers_dead_letter_them() -> None:
    assert issubclass(InvalidEvent, UndecodableEvent)
    with pytest.raises(UndecodableEvent, match="tombstone"):
        decode_record(events_pb2.Interaction, None)


def test_producer_headers_from_a_topic_name() -> None:
    assert type_headers_for_topic("ns.apprentice.feedback.v1") == [(TYPE_HEADER, b"apprentice.v1.FeedbackEvent")]
    assert type_headers_for_topic("apprentice.interactions.v1") == [(TYPE_HEADER, b"apprentice.v1.Interaction")]
    assert type_headers_for_topic("ns.apprentice-grader-join") is None
