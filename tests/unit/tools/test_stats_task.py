from __future__ import annotations

import pytest

from tools.demo.stats import newcombe_diff, wilson
from tools.tasks.task import TaskError, check_answer, load_task


def test_wilson_by_hand() -> None:
    # 0/20: centre z²/2n/(1+z²/n) = 0.09604/1.19208 -> upper = 2*0.0806 = 0.1611 (Wilson 1927)
    lo, hi = wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    lo, hi = wilson(10, 20)
    assert (lo, hi) == (pytest.approx(0.2993, abs=1e-4), pytest.approx(0.7007, abs=1e-4))


def test_newcombe_example_from_the_paper() -> None:
    # Newcombe 1998, example (a): 56/70 vs 48/80 -> d = 0.2, CI (0.0524, 0.3339) for p1 - p2
    d, lo, hi = newcombe_diff(48, 80, 56, 70)
    assert d == pytest.approx(0.2) and lo == pytest.approx(0.0524, abs=1e-3) and hi == pytest.approx(0.3339, abs=1e-3)


def test_shipped_task_splits_and_checks() -> None:
    task = load_task("support_desk")
    assert len(task.facts) == 10
    train, held = task.train_questions(), task.held_out_questions()
    assert len(held) == 20 and not {q for _, q in train} & {q for _, q in held}
    fact = task.fact_by_id("return_form")
    assert check_answer(fact, "Please fill in form rf-7734.").value == 1.0
    assert check_answer(fact, "Use the returns form.").value == 0.0
    assert check_answer(task.fact_by_id("sunday_hours"), "We close at 4 pm on Sundays").value == 1.0


def test_bad_task_file_is_a_clear_error(tmp_path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: x\nfacts:\n  - {id: a, fact: f, correction: c, questions: [q1, q2, q3], answer_check: {type: regex, pattern: '('}}\n")
    with pytest.raises(TaskError, match="invalid regular expression"):
        load_task(p)
    with pytest.raises(TaskError, match="shipped tasks: support_desk"):
        load_task("nope")
