"""TaskGraders --> TaskPlan: what the per-record path asks of a task, worked out once per task.

`TaskGraders` answers questions such as `judges` or `needs_feedback` through properties that rebuild
lists on every call; the grader asks them several times for every record. A plan holds the answers
(and each grader's function) for the lifetime of the config, so grading a record costs the graders
themselves and little else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from services.grader.core.signal_graders import grade_feedback, grade_judge, grade_kpi
from shared.grading import (
    ContainsSpec,
    ExactSpec,
    FeedbackSpec,
    JsonSchemaSpec,
    JudgeSpec,
    KpiSpec,
    RegexSpec,
    RuleResult,
    TaskGraders,
    VerifierSpec,
)
from shared.grading.rules import grade_contains, grade_exact, grade_json_schema, grade_regex, grade_verifier
from shared.proto.apprentice.v1 import events_pb2

Feedback = Sequence[events_pb2.FeedbackEvent]
Judge = dict[str, dict[str, Any]]
GradeFn = Callable[[Any, str, "dict[str, Any] | None", Feedback, Judge], RuleResult]
"""(spec, response text, reference, feedback, judge results) --> RuleResult."""


@dataclass(frozen=True)
class TaskPlan:
    task: TaskGraders
    graders: tuple[tuple[Any, GradeFn], ...]
    """(spec, its grade function) in config order."""
    judge_names: tuple[str, ...]
    feedback_names: frozenset[str]
    """Weighted feedback/kpi graders: the ones that make a task wait and count as its signal."""
    success: tuple[tuple[str, float], ...]
    """(name, success_threshold) of the graders marked `success`, in config order (the first with
    signal decides)."""
    needs_feedback: bool
    waits_for_feedback: bool
    uses_reference: bool
    """Some grader reads `reference` (a reference_key, or a verifier, which always receives it)."""
    judge_and_kpi: bool
    """Both an LLM judge and a KPI grader: the judge-vs-KPI detector applies."""
    reads: frozenset[str] = frozenset()
    """Feedback kinds some feedback/kpi grader reads, weight 0 included (`correction`, `kpi:<name>`, ...)."""

    @classmethod
    def build(cls, task: TaskGraders) -> TaskPlan:
        graders = tuple((spec, _grade_fn(spec)) for spec in task.graders)
        return cls(
            task=task, graders=graders, judge_names=tuple(j.name for j in task.judges),
            feedback_names=frozenset(g.name for g in task.feedback_graders),
            success=tuple((g.name, g.success_threshold) for g in task.graders if g.success),
            needs_feedback=task.needs_feedback, waits_for_feedback=task.waits_for_feedback,
            uses_reference=any(isinstance(g, VerifierSpec) or getattr(g, "reference_key", None) is not None
                               for g in task.graders),
            judge_and_kpi=any(isinstance(g, JudgeSpec) for g in task.graders)
            and any(isinstance(g, KpiSpec) for g in task.graders),
            reads=frozenset(f"kpi:{g.kpi}" if isinstance(g, KpiSpec) else g.kind for g in task.graders
                            if isinstance(g, FeedbackSpec | KpiSpec)))


def _grade_fn(spec: Any) -> GradeFn:
    """The grade function of one grader entry (the dispatch done once instead of per record)."""
    kind = type(spec)
    if kind in (FeedbackSpec, KpiSpec):
        by_feedback = grade_feedback if kind is FeedbackSpec else grade_kpi
        return lambda s, text, ref, fb, judge: by_feedback(s, fb)
    if kind is JudgeSpec:
        return lambda s, text, ref, fb, judge: grade_judge(s, judge)
    if kind in (RegexSpec, JsonSchemaSpec):  # the text alone
        on_text = grade_regex if kind is RegexSpec else grade_json_schema
        return lambda s, text, ref, fb, judge: on_text(s, text)
    by_type: dict[type, Callable[..., RuleResult]] = {ExactSpec: grade_exact, ContainsSpec: grade_contains,
                                                       VerifierSpec: grade_verifier}
    with_reference = by_type.get(kind)
    if with_reference is None:
        raise TypeError(f"unknown grader spec {kind.__name__}")
    return lambda s, text, ref, fb, judge: with_reference(s, text, ref)


_PLANS: dict[int, TaskPlan] = {}
_MAX_PLANS = 4096


def plan_for(task: TaskGraders) -> TaskPlan:
    """The plan of `task`, cached by identity (configs are immutable; a plan keeps its task alive, so an
    id is never reused while cached)."""
    plan = _PLANS.get(id(task))
    if plan is None or plan.task is not task:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[id(task)] = TaskPlan.build(task)
    return plan
