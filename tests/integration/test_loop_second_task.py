"""`apprentice demo --task velo_atelier --quick` with the tiny model: a task of another organisation
(its own tenant, task tag and KPI, unicode text, three facts, no OOD set) learns as the shipped one does.
The grader rewards its KPI as soon as the backend reports it (not at the end of a catch-all window), the
trainer trains its tenant, the gate passes a new version, and the report and plot come out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import read_all
from tools.demo import cli as demo_cli
from tools.tasks.task import load_task

pytestmark = pytest.mark.integration


def test_quick_demo_runs_a_second_organisations_task(kafka_bootstrap: str, tiny_model_name: str, tmp_home: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    task = load_task("velo_atelier")
    report_path = tmp_home / "out" / "report.json"
    t0 = time.monotonic()
    rc = demo_cli.main(["--task", "velo_atelier", "--quick", "--model", tiny_model_name, "--report", str(report_path)])
    elapsed = time.monotonic() - t0
    assert rc == 0
    out = capsys.readouterr().out
    assert "OOD change" in out, out   # no OOD set of its own: the packaged general questions are asked
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert (report["tenant"], report["task_tag"], report["kpi"]) == ("loewenzahn-velo", "werkstatt", "booking_confirmed")
    r0, r1 = report["rounds"]
    assert r0["eval"]["greedy_total"] == 3
    assert r0["eval"]["ood_total"] == r0["eval"]["ood_general_total"] == 40 and r0["eval"]["ood_rate"] is not None
    # 10 users on 9 training questions: every one answered and graded within the round
    assert r1["deploy"]["answers"] == r1["deploy"]["graded"] == 10, r1["deploy"]
    assert r1["policy_version"] not in ("", "base"), r1
    assert r1["knowledge_items"] and any("Bärengasse" in i or "CHF 89" in i or "Donnerstag" in i
                                         for i in r1["knowledge_items"]), r1["knowledge_items"]
    assert report["summary"]["ood_diff"] is not None
    assert (report_path.parent / "learning_curve.png").stat().st_size > 0
    # the graded records carry the task's KPI as their reward, graded with the config the demo generated
    graded = [decode(events_pb2.GradedInteraction, m.value())
              for m in read_all(kafka_bootstrap, Topics(report["topic_prefix"]).graded)]
    mine = [g for g in graded if g.envelope.tenant == task.tenant and g.interaction.task == task.task]
    assert len({g.interaction.interaction_id for g in mine}) == 10
    for g in mine:
        assert g.grader_config_version.startswith("task-velo_atelier-"), g.grader_config_version
        kpi = [c for c in g.components if c.name == "booking_confirmed"]
        assert g.has_signal and kpi and kpi[0].has_signal and g.reward == kpi[0].value == float(g.success)
    print(f"quick demo on velo_atelier: {elapsed:.0f} s")
