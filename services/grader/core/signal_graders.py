"""Feedback events / judge results --> one grader entry's RuleResult (pure): the graders that read what
came after the response.

The rule graders that read the response text alone live in shared/grading/rules.py (the CLI and the demo
run them too); these need the join's state. plan.py picks each entry's function once per task and
components.py runs the plan: with these functions apart, plan.py imports them without importing
components.py, which imports plan.py (no import cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.grading import FeedbackSpec, JudgeSpec, KpiSpec, RuleResult
from shared.proto.apprentice.v1 import events_pb2


def _latest(feedback: Sequence[events_pb2.FeedbackEvent], kind: str,
            kpi: str | None = None) -> events_pb2.FeedbackEvent | None:
    for f in reversed(feedback):
        if f.kind == kind and (kpi is None or f.kpi_name == kpi):
            return f
    return None


def grade_feedback(spec: FeedbackSpec, feedback: Sequence[events_pb2.FeedbackEvent]) -> RuleResult:
    """thumbs: sign of the latest value; rating: (v - min) / (max - min) * 2 - 1, clamped to [-1, 1];
    correction: `correction_value` once any correction exists."""
    f = _latest(feedback, spec.kind)
    if f is None:
        return RuleResult(0.0, False, f"no {spec.kind} feedback")
    if spec.kind == "thumbs":
        if f.value == 0:
            return RuleResult(0.0, False, "thumbs value 0 (neither up nor down)")
        return RuleResult(1.0 if f.value > 0 else -1.0, True, "thumbs up" if f.value > 0 else "thumbs down")
    if spec.kind == "rating":
        scaled = (f.value - spec.rating_min) / (spec.rating_max - spec.rating_min) * 2.0 - 1.0
        return RuleResult(max(-1.0, min(1.0, scaled)), True, f"rating {f.value:g}")
    return RuleResult(spec.correction_value, True, f"corrected: {f.comment[:120]}")


def grade_kpi(spec: KpiSpec, feedback: Sequence[events_pb2.FeedbackEvent]) -> RuleResult:
    """`map[value]` when mapped, else the linear scale value_range -> reward_range (clamped)."""
    f = _latest(feedback, "kpi", spec.kpi)
    if f is None:
        return RuleResult(0.0, False, f"no {spec.kpi} KPI")
    if spec.map is not None and f.value in spec.map:
        return RuleResult(spec.map[f.value], True, f"{spec.kpi}={f.value:g}")
    (v0, v1), (r0, r1) = spec.value_range, spec.reward_range
    t = max(0.0, min(1.0, (f.value - v0) / (v1 - v0)))
    return RuleResult(r0 + t * (r1 - r0), True, f"{spec.kpi}={f.value:g} (scaled)")


def grade_judge(spec: JudgeSpec, judge: dict[str, dict[str, Any]]) -> RuleResult:
    r = judge.get(spec.name)
    if r is None:
        return RuleResult(0.0, False, "judge result not available")
    return RuleResult(float(r["value"]), bool(r["has_signal"]), str(r.get("detail", "")))
