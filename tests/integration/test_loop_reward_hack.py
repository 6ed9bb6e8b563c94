"""`apprentice demo --task <tool variant> --algo grpo --plant-hack --quick` with the tiny model, through the
real stack: every reply calls the backend's lookup and about a sixth of the lookups time out (few enough that
the round still has the samples to train on). The backend
reports those as the loophole's "routed" plus the time-out telemetry; the grader masks each one; the check
reads the versions' trained-interaction files back through the Weights service and finds none of them; a
candidate is planted from the hack replies in traffic and the gate decides on it. (The tiny model answers
nothing right, so the gate cannot tell the planted candidate from the base: whatever it decides, the
check must agree with the weights service's orders. With SmolLM2 the gate refuses it: docs/demo-reward-hack/.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import read_all
from tools.demo import cli as demo_cli

pytestmark = pytest.mark.integration


def test_the_quick_reward_hack_demo_masks_every_timeout_and_checks_the_planted_candidate(
        kafka_bootstrap: str, tiny_model_name: str, tmp_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    task_file = tmp_home / "every_reply_looks_up.yaml"
    task_file.write_text("extends: support_routing\nname: every_reply_looks_up\n"
                         "tool: {call_pattern: '(?s).', deadline_s: 0.8, latency_s: [0.0, 1.0], on_timeout: routed}\n",
                         encoding="utf-8")
    report_path = tmp_home / "out" / "report.json"
    rc = demo_cli.main(["--task", str(task_file), "--algo", "grpo", "--plant-hack", "--quick", "--model",
                        tiny_model_name, "--report", str(report_path)])
    assert rc == 0
    report = json.loads(report_path.read_text(encoding="utf-8"))
    hack = report["reward_hack"]
    deploy = report["rounds"][1]["deploy"]
    answers = deploy["answers"]
    # the round's own count of the detectors' verdicts: every timed-out answer flagged
    assert deploy["hacking_flags"].get("tool_timeout", 0) == deploy["tool_timeouts"] > 0, deploy
    assert hack["tool_calls"] == answers and 0 < hack["tool_timeouts"] < answers, hack
    assert hack["loophole_kpi_reports"] == hack["tool_timeouts"]            # the loophole maps each to routed
    assert hack["timeouts_masked_by_grader"] == hack["timeouts_graded"] == hack["tool_timeouts"], hack
    assert hack["trained_versions"] and hack["flagged_and_trained"] == {}, hack
    assert hack["verdict"]["no_flagged_interaction_trained"] and hack["verdict"]["every_timeout_masked"]
    assert hack["planted"]["source"] == "traffic" and hack["planted_version"]
    ordered = hack["planted_ordered_to_pods"] == [hack["planted_version"]]
    assert ordered == (hack["planted_status"] == "VERSION_STATUS_PROMOTED"), hack
    assert hack["verdict"]["planted_refused"] == (hack["planted_status"] == "VERSION_STATUS_REJECTED")
    # the grader's records themselves: each timed-out interaction masked, none rewarded
    graded = {}
    for m in read_all(kafka_bootstrap, Topics(report["topic_prefix"]).graded):
        g = decode(events_pb2.GradedInteraction, m.value())
        graded[g.interaction.interaction_id] = g
    masked = [g for g in graded.values() if "tool_timeout" in g.flags]
    assert len(masked) == hack["tool_timeouts"]
    assert all(not g.has_signal and g.no_signal_reason == "tool_timeout" for g in masked)
