"""The demo's continual mode (`--facts-per-round`): each round's users ask only about that round's new facts,
and the forgetting matrix follows every earlier group of facts, weights only, round by round."""

from __future__ import annotations

import random

from tools.demo.report import forgetting_matrix
from tools.demo.simulated_users import pick_questions
from tools.tasks.task import load_task


def test_users_ask_only_about_the_rounds_facts_evenly() -> None:
    task = load_task("support_desk")
    first = {f.id for f in task.facts[:3]}
    got = pick_questions(task, random.Random(0), 30, first)
    assert len(got) == 30 and {f.id for f, _ in got} == first
    assert all(sum(f.id == fid for f, _ in got) == 10 for fid in first)      # as evenly as possible
    held = {q for _, q in task.held_out_questions()}
    assert not held & {q for _, q in got}                                   # never a held-out question
    assert pick_questions(task, random.Random(0), 5, set()) == []           # no fact: nobody asks
    assert {f.id for f, _ in pick_questions(task, random.Random(0), 40)} == {f.id for f in task.facts}


def test_forgetting_matrix_per_cohort_and_round() -> None:
    cohorts = {"a": 1, "b": 1, "c": 2, "d": 3}
    rounds = [
        {"round": 0, "eval_weights_only": {"per_fact": {"a": [0, 5], "b": [0, 5], "c": [0, 5], "d": [0, 5]}}},
        {"round": 1, "eval_weights_only": {"per_fact": {"a": [5, 5], "b": [3, 5], "c": [0, 5], "d": [0, 5]}}},
        {"round": 2, "eval_weights_only": {"per_fact": {"a": [4, 5], "b": [3, 5], "c": [5, 5], "d": [1, 5]}}},
    ]
    assert forgetting_matrix(rounds, cohorts) == [
        {"round": 0},
        {"round": 1, "cohort_1": 0.8},
        {"round": 2, "cohort_1": 0.7, "cohort_2": 1.0},
    ]
    assert forgetting_matrix([{"round": 1, "eval": {"per_fact": {}}}], cohorts) == [{"round": 1, "cohort_1": None}]
