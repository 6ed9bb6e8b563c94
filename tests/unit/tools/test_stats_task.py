from __future__ import annotations

import pytest

from tools.demo.stats import min_detectable_effect, newcombe_diff, paired_bootstrap_diff, wilson
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
    with pytest.raises(TaskError, match=r"shipped tasks: .*\bsupport_desk\b"):
        load_task("nope")


def test_minimum_detectable_effect_by_hand() -> None:
    # p = 0.25, n = 220: sqrt(2 * 0.25 * 0.75 / 220) = 0.041286; (1.95996 + 0.84162) * 0.041286 = 0.11567
    assert min_detectable_effect(0.25, 220) == pytest.approx(0.11567, abs=1e-4)
    # four times the trials halve it
    assert min_detectable_effect(0.25, 880) == pytest.approx(0.11567 / 2, abs=1e-4)
    with pytest.raises(ValueError):
        min_detectable_effect(0.25, 0)


def test_paired_bootstrap_by_message() -> None:
    # every message gains one success of four: no message-to-message spread, so the interval is the point
    assert paired_bootstrap_diff([(1, 4)] * 10, [(2, 4)] * 10) == (0.25, 0.25, 0.25)
    # half the messages flip from all wrong to all right and the other half the other way: d = 0, and the
    # interval is wide, as it must be when the change depends on which messages were drawn
    d, lo, hi = paired_bootstrap_diff([(0, 4)] * 5 + [(4, 4)] * 5, [(4, 4)] * 5 + [(0, 4)] * 5)
    assert d == 0.0 and lo < -0.3 and hi > 0.3
    # the same draws for the same seed (a report is reproducible)
    data = [(i % 3, 4) for i in range(12)], [((i + 1) % 4, 4) for i in range(12)]
    assert paired_bootstrap_diff(*data) == paired_bootstrap_diff(*data)
    with pytest.raises(ValueError, match="same non-empty messages"):
        paired_bootstrap_diff([(1, 4)], [(1, 4), (2, 4)])
