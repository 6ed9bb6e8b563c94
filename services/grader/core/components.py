"""Interaction + FeedbackEvents + judge results --> RewardComponents --> (reward, has_signal, success).

Pure functions. Each configured grader yields one component, always kept in the record, with
`has_signal=False` when it could not judge (no feedback yet, a verifier that gave up, an unparseable
judge). The reward is the weighted mean of the components that have signal:

    reward = sum_i w_i * v_i / sum_i w_i      over components with has_signal and w_i > 0

so a missing signal is *masked*, never counted as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.grader.core.plan import plan_for
from shared.grading import TaskGraders
from shared.proto.apprentice.v1 import events_pb2


@dataclass(slots=True)
class Combined:
    reward: float
    has_signal: bool
    success: bool


def reference_for(interaction: events_pb2.Interaction,
                  feedback: Sequence[events_pb2.FeedbackEvent]) -> dict[str, Any]:
    """What stream rules may compare against (`reference_key`): the prompt, the task, the latest correction."""
    corrections = [f.comment for f in feedback if f.kind == "correction" and f.comment]
    users = [m.content for m in interaction.messages if m.role == "user"]
    return {"task": interaction.task, "prompt": users[-1] if users else interaction.prompt_text,
            "correction": corrections[-1] if corrections else None}


def compute_components(task: TaskGraders, interaction: events_pb2.Interaction,
                       feedback: Sequence[events_pb2.FeedbackEvent],
                       judge: dict[str, dict[str, Any]] | None = None) -> list[events_pb2.RewardComponent]:
    """One component per configured grader, in config order."""
    plan = plan_for(task)
    text = interaction.response_text
    reference = reference_for(interaction, feedback) if plan.uses_reference else None
    judge = judge or {}
    component = events_pb2.RewardComponent
    out = []
    for spec, grade in plan.graders:
        r = grade(spec, text, reference, feedback, judge)
        out.append(component(name=spec.name, value=r.value, weight=spec.weight, has_signal=r.has_signal,
                             detail=r.detail[:500]))
    return out


def combine(task: TaskGraders, components: Sequence[events_pb2.RewardComponent]) -> Combined:
    """Weighted mean over components with signal; `success` from the first success grader with signal.

    When the task needs feedback and no weighted feedback grader has signal, there is no signal at all:
    a reward from the immediate graders alone would teach the wrong thing."""
    plan = plan_for(task)
    total_w, weighted, feedback_signal = 0.0, 0.0, False
    for c in components:
        if c.has_signal and c.weight > 0:
            total_w += c.weight
            weighted += c.weight * c.value
            feedback_signal = feedback_signal or c.name in plan.feedback_names
    reward = weighted / total_w if total_w > 0 else 0.0
    has_signal = total_w > 0 and (feedback_signal or not plan.needs_feedback)
    if not has_signal:
        reward = 0.0
    success = False
    if plan.success:
        by_name = {c.name: c for c in components}
        for name, threshold in plan.success:
            c = by_name[name]
            if c.has_signal:
                success = c.value >= threshold
                break
    return Combined(reward, has_signal, success)


def feedback_complete(task: TaskGraders, components: Sequence[events_pb2.RewardComponent]) -> bool:
    """Whether the weighted feedback graders have what `emit_when` asks for (emit before the window ends)."""
    if task.emit_when == "window_end":
        return False
    names = plan_for(task).feedback_names
    have = [c.has_signal for c in components if c.name in names]
    if not have:
        return True
    return all(have) if task.emit_when == "all_feedback" else any(have)
