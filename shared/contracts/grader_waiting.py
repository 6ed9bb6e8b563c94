"""What the grader is waiting for, read back from its /metrics: open feedback windows per tenant and task,
and feedback no rule reads.

The grader exports these series at every tick (services/grader/metrics.py; names in metric_names.py):

    apprentice_grader_waiting{tenant,task}                          interactions whose window is open
    apprentice_grader_waiting_first_deadline_seconds{tenant,task}   earliest window end (epoch s)
    apprentice_grader_waiting_last_deadline_seconds{tenant,task}    latest window end (epoch s)
    apprentice_grader_waiting_window_seconds{tenant,task}           the task's window now
    apprentice_grader_unread_feedback_now{tenant,task,kind}         feedback no grader of the task reads,
                                                                    while the rules in effect read none of it

`apprentice status` (tools/stack/) and the dashboard's Health page read them back with `from_metrics` and
print `describe`'s lines: a contract between the grader and its readers, so neither imports the other.
Pure: no Kafka, no prometheus_client here.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from shared.contracts.metric_names import (
    GRADER_UNREAD_FEEDBACK_NOW,
    GRADER_WAITING,
    GRADER_WAITING_FIRST_DEADLINE,
    GRADER_WAITING_LAST_DEADLINE,
    GRADER_WAITING_WINDOW,
)

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str | None, names: set[str]) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of the finite samples of `names` in a Prometheus text exposition."""
    out = []
    for line in (text or "").splitlines():
        m = _SAMPLE.match(line)
        if not m or m["name"] not in names:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if math.isfinite(value):
            labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m["labels"] or "")}
            out.append((m["name"], labels, value))
    return out


@dataclass
class Waiting:
    tenant: str
    task: str
    count: int = 0
    first_deadline: float | None = None
    last_deadline: float | None = None
    window_s: float | None = None


@dataclass
class WaitingReport:
    tasks: list[Waiting] = field(default_factory=list)
    unread: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """(tenant, task, kind) -> feedback events no grader read."""

    @property
    def total(self) -> int:
        return sum(w.count for w in self.tasks)

    def as_dict(self) -> dict[str, Any]:
        return {"waiting": self.total,
                "tasks": [w.__dict__ for w in self.tasks],
                "unread_feedback": [{"tenant": t, "task": k, "kind": kind, "count": n}
                                    for (t, k, kind), n in sorted(self.unread.items())]}


def from_metrics(text: str | None) -> WaitingReport | None:
    """The grader's waiting summary from its /metrics text; None when the grader did not answer."""
    if text is None:
        return None
    by: dict[tuple[str, str], Waiting] = {}
    report = WaitingReport()
    attr = {GRADER_WAITING: "count", GRADER_WAITING_FIRST_DEADLINE: "first_deadline",
            GRADER_WAITING_LAST_DEADLINE: "last_deadline", GRADER_WAITING_WINDOW: "window_s"}
    for name, labels, value in samples(text, {*attr, GRADER_UNREAD_FEEDBACK_NOW}):
        tenant, task = labels.get("tenant", ""), labels.get("task", "")
        if name == GRADER_UNREAD_FEEDBACK_NOW:
            if value > 0:
                report.unread[(tenant, task, labels.get("kind", ""))] = int(value)
            continue
        w = by.setdefault((tenant, task), Waiting(tenant, task))
        setattr(w, attr[name], int(value) if name == GRADER_WAITING else value)
    report.tasks = sorted((w for w in by.values() if w.count > 0), key=lambda w: (-w.count, w.tenant, w.task))
    return report


def _clock(epoch: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch)) if epoch is not None else "?"


def describe(report: dict[str, Any] | WaitingReport | None) -> list[str]:
    """Lines for an operator: how many answers wait for feedback, for which task, until when, and which
    feedback kinds no rule reads. `report`: a WaitingReport or its `as_dict()`."""
    if report is None:
        return ["grader: waiting summary unavailable (the grader's metrics endpoint did not answer)"]
    d = report.as_dict() if isinstance(report, WaitingReport) else report
    tasks, unread = d.get("tasks") or [], d.get("unread_feedback") or []
    total = d.get("waiting", 0)
    if not total:
        head = "grader: no answers waiting for feedback"
    else:
        parts = []
        for w in tasks[:3]:
            window = f"window {w['window_s']:g} s, " if w.get("window_s") is not None else ""
            count = f"{w['count']} for " if len(tasks) > 1 else ""
            parts.append(f"{count}tenant {w['tenant']}/task {w['task']}, {window}"
                         f"first graded at {_clock(w.get('first_deadline'))}"
                         + (f", last at {_clock(w['last_deadline'])}" if w.get("last_deadline") not in
                            (None, w.get("first_deadline")) else ""))
        more = f"; and {len(tasks) - 3} more tasks" if len(tasks) > 3 else ""
        head = (f"grader: {total} answer{'s' if total != 1 else ''} waiting for feedback ("
                + "; ".join(parts) + more + ")")
    lines = [head]
    if unread:
        kinds = sorted({u["kind"].replace("kpi:", "kpi ") for u in unread})
        where = ", ".join(f"{u['tenant']}/{u['task']} {u['kind'].replace('kpi:', 'kpi ')} x{u['count']}" for u in unread[:5])
        lines.append(f"grader: feedback kinds no rule reads: {', '.join(kinds)} ({where}); "
                     "set one with `apprentice grader rules set`")
    return lines
