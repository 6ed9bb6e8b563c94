"""LLM judge prompts and parsing (RULER-style relative scoring of a group)."""

from __future__ import annotations

from services.grader.core.judge import build_messages, parse_scores, score_group
from tests.helpers.grader import interaction


def test_group_prompt_lists_every_response_and_asks_for_relative_scores() -> None:
    members = [interaction(text=f"answer {i}", group_id="g", group_size=3) for i in range(3)]
    msgs = build_messages("States the warranty period.", members)
    assert msgs[0][0] == "system" and msgs[1][0] == "user"
    body = msgs[1][1]
    assert "States the warranty period." in body and "How long is the warranty?" in body
    assert all(f"[{i}] Response {i}:" in body for i in (1, 2, 3))
    assert "relative to each other" in body and '"scores"' in body
    assert "relative" not in build_messages("r", members[:1])[1][1]


def test_parse_json_fenced_and_line_formats() -> None:
    assert parse_scores('{"scores": [7, 3.5, 10]}', 3) == [7.0, 3.5, 10.0]
    assert parse_scores('Here you go:\n```json\n{"scores": [1, 2]}\n```', 2) == [1.0, 2.0]
    assert parse_scores("[1] 8\n[2] 4", 2) == [8.0, 4.0]
    assert parse_scores("Response 1: 6/10\nResponse 2: 9/10", 2) == [6.0, 9.0]


def test_unreadable_or_out_of_range_is_none() -> None:
    assert parse_scores('{"scores": [7, 3]}', 3) is None  # wrong count
    assert parse_scores('{"scores": [70, 3]}', 2) is None  # out of range
    assert parse_scores("I think the first one is better.", 2) is None
    assert parse_scores("", 1) is None


def test_score_group_values_and_no_signal() -> None:
    a, b = interaction(text="a"), interaction(text="b")
    scored = score_group([a, b], '{"scores": [8, 2]}')
    assert [(s.interaction_id, s.value, s.has_signal) for s in scored] == [(a.interaction_id, 0.8, True),
                                                                           (b.interaction_id, 0.2, True)]
    assert "relative, group of 2" in scored[0].detail
    unreadable = score_group([a, b], "blah blah")
    assert all(not s.has_signal for s in unreadable) and "unreadable" in unreadable[0].detail
    failed = score_group([a], None, "UNAVAILABLE: connection refused")
    assert not failed[0].has_signal and "connection refused" in failed[0].detail
