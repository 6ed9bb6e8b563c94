"""The Prometheus sample names that readers of a service's /metrics rely on: `apprentice status`
(tools/stack/cli.py), the dashboard's Health page (services/dashboard/backends.py) and the demo's training
progress (tools/demo/train_progress.py) read these series from outside the service.

The services define their collectors from these names (services/<name>/metrics.py), so a renamed metric
cannot silently blank a report that reads it. Names are the sample names as they appear in the text
exposition: a counter's carries its `_total` suffix.
"""

from __future__ import annotations

INFERENCE_SPOOL_DEPTH = "apprentice_inference_spool_depth"
"""Gauge: captured events written to the inference pod's spool, not yet acknowledged by Kafka."""

TRAINER_OPTIMIZER_STEPS = "apprentice_trainer_optimizer_steps_total"
"""Counter (label `algorithm`): optimizer steps the trainer process has taken."""

GRADER_WAITING = "apprentice_grader_waiting"
"""Gauge {tenant,task}: interactions whose feedback window is open."""
GRADER_WAITING_FIRST_DEADLINE = "apprentice_grader_waiting_first_deadline_seconds"
"""Gauge {tenant,task}: earliest window end (epoch seconds) of the interactions waiting."""
GRADER_WAITING_LAST_DEADLINE = "apprentice_grader_waiting_last_deadline_seconds"
"""Gauge {tenant,task}: latest window end (epoch seconds) of the interactions waiting."""
GRADER_WAITING_WINDOW = "apprentice_grader_waiting_window_seconds"
"""Gauge {tenant,task}: the task's feedback window now (seconds)."""
GRADER_UNREAD_FEEDBACK = "apprentice_grader_unread_feedback_total"
"""Counter {tenant,task,kind}: feedback events no grader of the task reads (it never goes down)."""
GRADER_UNREAD_FEEDBACK_NOW = "apprentice_grader_unread_feedback_now"
"""Gauge {tenant,task,kind}: the same, only while the rules in effect still read none of it: what status and
the dashboard report, since the counter would keep reporting a kind that a rule set since reads."""


def counter_name(sample: str) -> str:
    """The name to give prometheus_client's Counter for a counter sample name (it appends `_total`)."""
    if not sample.endswith("_total"):
        raise ValueError(f"{sample}: a counter's sample name ends in _total")
    return sample.removesuffix("_total")
