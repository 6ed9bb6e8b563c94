"""Prometheus metrics of the grader (served on :9102, docs/architecture.md §2).

Detector flags are counted per flag; the rolling statistics behind them (reward-length correlation,
mean length, truncation rate, mean reward per policy version) are exported as gauges so that a
dashboard shows a drift before the flags fire.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from services.grader.core import waiting as W
from services.grader.core.detectors import DetectorStats
from services.grader.core.plan import plan_for
from shared.contracts import metric_names as N
from shared.metrics import label_value
from shared.proto.apprentice.v1 import events_pb2

RECORDS = Counter("apprentice_grader_records_total", "Graded records emitted (every revision)",
                  ["tenant", "task", "signal"])
REVISIONS = Counter("apprentice_grader_revisions_total", "Emissions with revision > 1 (late feedback)",
                    ["tenant", "task"])
FLAGS = Counter("apprentice_grader_flags_total", "Reward-hacking detector flags on emitted records",
                ["tenant", "task", "flag"])
QUARANTINED = Counter("apprentice_grader_quarantined_total", "Emitted records marked quarantined",
                      ["tenant", "task"])
MASKED = Counter("apprentice_grader_masked_total", "Records masked as no signal, by reason",
                 ["tenant", "task", "reason"])
REWARD = Histogram("apprentice_grader_reward", "Reward of records with signal", ["tenant", "task"],
                   buckets=(-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0))
EVENTS = Counter("apprentice_grader_events_total", "Join events applied, by kind and outcome",
                 ["kind", "outcome"])
DEADLETTERS = Counter("apprentice_grader_deadletters_total", "Records sent to the dead-letter topic",
                      ["stage"])
RECOVERED = Counter("apprentice_grader_recovery_total",
                    "Unconfirmed emissions found after a restart, by outcome (already_emitted | re_emitted)",
                    ["outcome"])
JUDGE_CALLS = Counter("apprentice_grader_judge_calls_total", "LLM judge calls, by outcome", ["outcome"])
PENDING = Gauge("apprentice_grader_pending", "Interactions in the table whose window is still open")
WAITING = Gauge(N.GRADER_WAITING, "Interactions whose feedback window is open, by tenant and task", ["tenant", "task"])
WAITING_FIRST = Gauge(N.GRADER_WAITING_FIRST_DEADLINE,
                      "Earliest window end (epoch seconds) of the interactions waiting for feedback", ["tenant", "task"])
WAITING_LAST = Gauge(N.GRADER_WAITING_LAST_DEADLINE,
                     "Latest window end (epoch seconds) of the interactions waiting for feedback", ["tenant", "task"])
WAITING_WINDOW = Gauge(N.GRADER_WAITING_WINDOW, "Feedback window (seconds) of a task with interactions waiting",
                       ["tenant", "task"])
UNREAD_FEEDBACK = Counter(N.counter_name(N.GRADER_UNREAD_FEEDBACK),
                          "Feedback events joined that no grader of their task reads (counted by this worker)",
                          ["tenant", "task", "kind"])
UNREAD_NOW = Gauge(N.GRADER_UNREAD_FEEDBACK_NOW,
                   "Feedback events joined that the grading rules in effect still do not read "
                   "(this worker's count; 0 once a rule reads the kind)", ["tenant", "task", "kind"])
RULES = Gauge("apprentice_grader_runtime_rules", "Grading rules set at run time (apprentice grader rules set) in effect")
BATCH_SECONDS = Histogram("apprentice_grader_batch_seconds", "Time to process one join batch",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))

LENGTH_CORR = Gauge("apprentice_grader_reward_length_corr", "Pearson r of reward and response length",
                    ["tenant", "task", "policy_version"])
MEAN_LENGTH = Gauge("apprentice_grader_mean_length_tokens", "Mean response length (tokens)",
                    ["tenant", "task", "policy_version"])
TRUNCATION = Gauge("apprentice_grader_truncation_rate", "Share of responses cut at max_new_tokens",
                   ["tenant", "task", "policy_version"])
MEAN_REWARD = Gauge("apprentice_grader_mean_reward", "Mean reward of records with signal",
                    ["tenant", "task", "policy_version"])


_children: dict[tuple[Any, ...], Any] = {}
_unread_exported: dict[tuple[str, str, str], int] = {}
"""(tenant, task, kind) -> the count of the joiner's `unread` already added to the counter."""
NO_CONFIG_NOTE = "no grader config for "


def _child(metric: Any, *labels: str) -> Any:
    """`metric.labels(*labels)`, remembered: labels() takes a lock and validates on every call, and the
    grader counts several series for every record."""
    key = (id(metric), *labels)
    child = _children.get(key)
    if child is None:
        if len(_children) > 50_000:  # label sets are tenants x tasks x flags; this only bounds a flood
            _children.clear()
        child = _children[key] = metric.labels(*labels)
    return child


def outcome_label(note: str) -> str:
    """A join step's note --> a bounded label value, spaces as `_` ("duplicate interaction" ->
    duplicate_interaction); "no grader config for <tenant>/<task>" loses its tenant and task."""
    return "no_grader_config" if note.startswith(NO_CONFIG_NOTE) else label_value(note)


def count_event(kind: str, outcome: str, n: int = 1) -> None:
    """Join items applied (`kind`: I, F, J, T) with their outcome (emitted, applied, or a note)."""
    _child(EVENTS, kind, outcome_label(outcome)).inc(n)


def count_emitted(rec: events_pb2.GradedInteraction) -> None:
    """Counters for one graded record that reached the graded topic."""
    tenant, task = rec.envelope.tenant, rec.interaction.task
    _child(RECORDS, tenant, task, "true" if rec.has_signal else "false").inc()
    if rec.revision > 1:
        _child(REVISIONS, tenant, task).inc()
    if rec.has_signal:
        _child(REWARD, tenant, task).observe(rec.reward)
    elif rec.no_signal_reason:
        _child(MASKED, tenant, task, rec.no_signal_reason).inc()
    for f in rec.flags:
        _child(FLAGS, tenant, task, f).inc()
    if rec.quarantined:
        _child(QUARANTINED, tenant, task).inc()


def export_stats(stats: DetectorStats) -> None:
    """Copy the detectors' rolling statistics into the gauges (called once per tick, not per record)."""
    for tenant, task, version, s in stats.snapshot():
        labels = (tenant, task, version)
        LENGTH_CORR.labels(*labels).set(s.length_reward_corr)
        MEAN_LENGTH.labels(*labels).set(s.mean_length)
        TRUNCATION.labels(*labels).set(s.truncation_rate)
        MEAN_REWARD.labels(*labels).set(s.mean_reward)


def export_waiting(index: W.WaitingIndex, joiner: Any) -> None:
    """The waiting summary and the unread-feedback counts into their gauges (once per tick). Series of
    tasks that no longer wait are removed."""
    summary = index.summary()
    for g in (WAITING, WAITING_FIRST, WAITING_LAST, WAITING_WINDOW):
        g.clear()
    for (tenant, task), (n, first, last) in summary.items():
        WAITING.labels(tenant, task).set(n)
        WAITING_FIRST.labels(tenant, task).set(first)
        WAITING_LAST.labels(tenant, task).set(last)
        graders = joiner.task_of(tenant, task)
        if graders is not None:
            WAITING_WINDOW.labels(tenant, task).set(graders.feedback_window_s)
    UNREAD_NOW.clear()
    for key, n in list(joiner.unread.items()):
        done = _unread_exported.get(key, 0)
        if n > done:
            _child(UNREAD_FEEDBACK, *key).inc(n - done)
        _unread_exported[key] = n
        graders = joiner.task_of(key[0], key[1])
        if graders is None or key[2] not in plan_for(graders).reads:
            UNREAD_NOW.labels(*key).set(n)
    RULES.set(len(joiner.book.rules()))
