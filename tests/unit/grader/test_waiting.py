"""The grader's waiting summary: kept per tenant and task by the index (services/grader/core/waiting.py),
exported as gauges (services/grader/metrics.py), read back from /metrics (shared/contracts/grader_waiting.py)
and shown by `apprentice status` and the dashboard's Health page."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from services.grader import metrics as M
from services.grader.core.detectors import DetectorStats
from services.grader.core.join import Joiner
from services.grader.core.rulebook import OPERATOR, new_record, parse_record
from services.grader.core.state import PendingState
from services.grader.core.waiting import WaitingIndex
from shared.contracts.grader_waiting import describe, from_metrics
from shared.grading import parse_grader_config
from tools.stack.status_view import render_status

CONFIG = parse_grader_config({"version": "v1", "tasks": [
    {"tenant": "*", "task": "*", "feedback_window_s": 600, "graders": [{"name": "t", "type": "feedback", "kind": "thumbs"}]}]})
T0 = 1_900_000_000.0


def state(key: str, tenant: str, task: str, deadline: float) -> PendingState:
    return PendingState(interaction_id=key, interaction=b"x", tenant=tenant, task=task, deadline=deadline, window=600)


def test_index_summary_per_tenant_and_task() -> None:
    w = WaitingIndex()
    w.update("a", state("a", "acme", "billing", T0 + 10), True)
    w.update("b", state("b", "acme", "billing", T0 + 5), True)
    w.update("c", state("c", "beta", "x", T0 + 1), True)
    w.update("c", state("c", "beta", "x", T0 + 1), False)     # closed: no longer waiting
    assert w.summary() == {("acme", "billing"): (2, T0 + 5, T0 + 10)}


def exposition(index: WaitingIndex, joiner: Joiner) -> str:
    M.export_waiting(index, joiner)
    registry = CollectorRegistry()
    for g in (M.WAITING, M.WAITING_FIRST, M.WAITING_LAST, M.WAITING_WINDOW, M.UNREAD_FEEDBACK,
              M.UNREAD_NOW):
        registry.register(g)
    return generate_latest(registry).decode()


def test_metrics_round_trip_and_the_operator_line() -> None:
    joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
    joiner.unread[("acme", "billing", "correction")] = 2
    joiner.unread[("acme", "billing", "kpi:resolved")] = 1
    w = WaitingIndex()
    for n in range(3):
        w.update(str(n), state(str(n), "acme", "billing", T0 + n), True)
    report = from_metrics(exposition(w, joiner))
    assert report is not None and report.total == 3
    [task] = report.tasks
    assert (task.tenant, task.task, task.count, task.first_deadline, task.last_deadline, task.window_s) == \
        ("acme", "billing", 3, T0, T0 + 2, 600.0)
    lines = describe(report)
    first = time.strftime("%H:%M:%S", time.localtime(T0))
    assert lines[0].startswith(f"grader: 3 answers waiting for feedback (tenant acme/task billing, window 600 s, "
                               f"first graded at {first}")
    assert lines[1].startswith("grader: feedback kinds no rule reads: correction, kpi resolved")
    assert describe(from_metrics("")) == ["grader: no answers waiting for feedback"]
    assert "unavailable" in describe(None)[0]


def test_a_kind_a_rule_now_reads_is_no_longer_reported_unread() -> None:
    """The unread counter never goes down; what status shows follows the rules in effect."""
    joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
    joiner.unread[("acme", "billing", "correction")] = 2
    joiner.unread[("acme", "billing", "kpi:resolved")] = 1
    before = describe(from_metrics(exposition(WaitingIndex(), joiner)))
    assert before[1].startswith("grader: feedback kinds no rule reads: correction, kpi resolved")
    kpi = {"graders": [{"name": "resolved", "type": "kpi", "kpi": "resolved", "map": {"1": 1.0, "0": 0.0}}]}
    record = new_record("acme", "billing", operator="op", rules=kpi).model_dump_json().encode()
    assert joiner.book.apply(parse_record(b"acme/billing", record, signer=OPERATOR))
    after = describe(from_metrics(exposition(WaitingIndex(), joiner)))
    assert after[1].startswith("grader: feedback kinds no rule reads: correction (") and "resolved" not in after[1]
    text = exposition(WaitingIndex(), joiner)
    assert 'apprentice_grader_unread_feedback_total{kind="kpi:resolved",task="billing",tenant="acme"} 1.0' in text


def test_status_and_dashboard_show_the_waiting_count_and_time(monkeypatch: Any) -> None:
    joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
    joiner.unread[("acme", "billing", "correction")] = 1
    w = WaitingIndex()
    w.update("a", state("a", "acme", "billing", T0), True)
    text = exposition(w, joiner)
    first = time.strftime("%H:%M:%S", time.localtime(T0))
    want = f"grader: 1 answer waiting for feedback (tenant acme/task billing, window 600 s, first graded at {first})"

    report = from_metrics(text)
    assert report is not None
    status = render_status({"broker": {"bootstrap": "b", "up": True}, "services": {},
                            "grader_waiting": report.as_dict()}, now=T0)
    assert want in status and "feedback kinds no rule reads: correction" in status

    from services.dashboard import backends as B

    be = B.Backends.__new__(B.Backends)
    monkeypatch.setattr(be, "_metrics", lambda name: text if name == "grader" else None, raising=False)
    monkeypatch.setattr(be, "_grpc_healthy", lambda name: True, raising=False)
    monkeypatch.setattr(be, "targets", B.Targets(grpc={}), raising=False)
    monkeypatch.setattr(be, "s", None, raising=False)
    monkeypatch.setattr(B, "partition_lag", lambda common: [])
    health = be.health()
    assert health["grader_waiting"]["waiting"] == 1 and want in health["grader_waiting"]["lines"]
