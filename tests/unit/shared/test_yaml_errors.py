"""A malformed task file names the file, line, column and what is wrong, on one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.tasks.task import TaskError, load_task

GOOD_FACT = """  - id: a
    fact: x
    answer_check: {type: contains, value: x}
    correction: c
    questions: [q1, q2, q3]
"""


def _load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    with pytest.raises(TaskError) as e:
        load_task(path)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, "name: t\nfacts:\n  - id: a\n    fact: [unclosed\n    correction: c\n")
    assert msg.startswith(f"{tmp_path / 'task.yaml'}:5:")
    assert "YAML syntax error" in msg


def test_schema_errors_point_at_the_offending_node(tmp_path: Path) -> None:
    text = "name: t\nfacts:\n" + GOOD_FACT + "    colour: red\n" + GOOD_FACT.replace("[q1, q2, q3]", "just one")
    msg = _load_error(tmp_path, text)
    path = tmp_path / "task.yaml"
    assert f"{path}:8:13: facts.0.colour: Extra inputs are not permitted" in msg
    assert f"{path}:13:16: facts.1.questions: Input should be a valid list" in msg


def test_missing_field_points_at_its_parent(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, "name: t\nfacts:\n" + GOOD_FACT.replace("    correction: c\n", ""))
    assert f"{tmp_path / 'task.yaml'}:3:5: facts.0.correction: Field required" in msg


def test_model_validator_error_is_located_at_top_level(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, "name: t\nheld_out_per_fact: 3\nfacts:\n" + GOOD_FACT)
    assert "1:1: (top level): fact 'a': needs more than held_out_per_fact=3 questions" in msg
