"""One full round of the loop through all five services over the real broker, with the tiny model:
the served policy version changes, and the new version's manifest links back to the Kafka offsets of
the graded records it was trained on."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts.events import decode
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import read_all

pytestmark = pytest.mark.integration


def test_one_round_changes_the_served_version_and_links_to_offsets(kafka_bootstrap: str, tiny_model_name: str,
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.demo.demo import Demo, DemoBudget
    from tools.tasks.task import load_task

    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    task = load_task("support_desk")
    demo = Demo(task, model=tiny_model_name, budget=DemoBudget.quick(1), algo="oel", report=tmp_path / "report.json",
                plot_path=tmp_path / "learning_curve.png", run_dir=tmp_path / "run")
    report = demo.run()

    r0, r1 = report["rounds"]
    assert r0["policy_version"] == "base"
    assert r1["policy_version"] not in ("", "base"), r1
    assert r1["deploy"]["graded"] == r1["deploy"]["answers"] == 10
    assert r1["knowledge_items"], "corrections should have become knowledge"
    offsets = r1["manifest"]["data_offsets"]
    graded_topic = demo.stack.topics.graded
    assert offsets and all(o["topic"] == graded_topic and o["end"] > o["start"] for o in offsets), r1
    # the offsets name real graded records of this run's tenant
    records = read_all(kafka_bootstrap, graded_topic)
    by_pos = {(m.partition(), m.offset()): decode(events_pb2.GradedInteraction, m.value()) for m in records}
    linked = [by_pos[(o["partition"], off)] for o in offsets for off in range(o["start"], o["end"])
              if (o["partition"], off) in by_pos]
    assert linked and all(g.envelope.tenant == task.tenant for g in linked)
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    assert not report["services_restarted"]
