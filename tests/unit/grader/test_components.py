"""Graders -> components -> reward: feedback and KPI mapping, weighted combination, masking, success."""

from __future__ import annotations

import pytest

from services.grader.core.components import combine, compute_components, feedback_complete
from shared.grading import TaskGraders
from tests.helpers.grader import feedback, interaction


def task(**kw: object) -> TaskGraders:
    return TaskGraders.model_validate(kw)


def test_thumbs_rating_correction_mapping() -> None:
    t = task(graders=[{"name": "th", "type": "feedback", "kind": "thumbs"},
                      {"name": "ra", "type": "feedback", "kind": "rating"},
                      {"name": "co", "type": "feedback", "kind": "correction"}])
    it = interaction()
    fb = [feedback(it.interaction_id, kind="thumbs", value=-1), feedback(it.interaction_id, kind="rating", value=4),
          feedback(it.interaction_id, kind="correction", comment="It is FORM-7")]
    c = {x.name: x for x in compute_components(t, it, fb)}
    assert c["th"].value == -1.0 and c["th"].has_signal
    assert c["ra"].value == pytest.approx(0.5)  # (4 - 1) / (5 - 1) * 2 - 1
    assert c["co"].value == -1.0 and "FORM-7" in c["co"].detail
    # the latest thumbs wins
    c2 = {x.name: x for x in compute_components(t, it, [*fb, feedback(it.interaction_id, kind="thumbs", value=1)])}
    assert c2["th"].value == 1.0


def test_kpi_map_and_linear_scale() -> None:
    t = task(graders=[{"name": "m", "type": "kpi", "kpi": "resolved", "map": {1: 1.0, 0: -0.5}},
                      {"name": "s", "type": "kpi", "kpi": "csat", "value_range": [0, 10],
                       "reward_range": [-1, 1]}])
    it = interaction()
    fb = [feedback(it.interaction_id, kpi_name="resolved", value=0), feedback(it.interaction_id, kpi_name="csat", value=7.5)]
    c = {x.name: x for x in compute_components(t, it, fb)}
    assert c["m"].value == -0.5
    assert c["s"].value == pytest.approx(0.5)  # -1 + 0.75 * 2
    fb.append(feedback(it.interaction_id, kpi_name="csat", value=42))
    assert {x.name: x for x in compute_components(t, it, fb)}["s"].value == 1.0  # clamped


def test_weighted_mean_over_components_with_signal() -> None:
    t = task(feedback_mode="optional", graders=[
        {"name": "num", "type": "regex", "pattern": "[0-9]+", "weight": 1.0},
        {"name": "kpi", "type": "kpi", "kpi": "resolved", "weight": 3.0, "success": True},
        {"name": "zero", "type": "regex", "pattern": "zzz", "weight": 0.0}])
    it = interaction(text="It is 24 months")
    comps = compute_components(t, it, [feedback(it.interaction_id, value=0.0)])
    r = combine(t, comps)
    assert r.reward == pytest.approx((1 * 1.0 + 3 * 0.0) / 4)
    assert r.has_signal and not r.success
    assert len(comps) == 3 and comps[2].weight == 0.0  # every component kept
    # no KPI yet: the rule alone carries the reward (feedback optional), masked KPI is not a 0
    r2 = combine(t, compute_components(t, it, []))
    assert r2.reward == 1.0 and r2.has_signal


def test_required_feedback_without_feedback_is_no_signal() -> None:
    t = task(graders=[{"name": "num", "type": "regex", "pattern": "[0-9]+"},
                      {"name": "kpi", "type": "kpi", "kpi": "resolved"}])
    r = combine(t, compute_components(t, interaction(text="24"), []))
    assert not r.has_signal and r.reward == 0.0


def test_feedback_complete_all_any_window_end() -> None:
    g = [{"name": "k", "type": "kpi", "kpi": "resolved"}, {"name": "t", "type": "feedback", "kind": "thumbs"}]
    it = interaction()
    one = [feedback(it.interaction_id, value=1)]
    assert not feedback_complete(task(graders=g), compute_components(task(graders=g), it, one))
    assert feedback_complete(task(graders=g, emit_when="any_feedback"), compute_components(task(graders=g), it, one))
    both = [*one, feedback(it.interaction_id, kind="thumbs", value=1)]
    assert feedback_complete(task(graders=g), compute_components(task(graders=g), it, both))
    assert not feedback_complete(task(graders=g, emit_when="window_end"), compute_components(task(graders=g), it, both))
