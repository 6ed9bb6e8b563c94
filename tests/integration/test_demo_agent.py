"""`apprentice demo --task <agent task> --algo grpo --plant-hack --quick` with the tiny model, through the
real stack: each simulated customer talks to an agent built with the OpenAI Agents SDK (unmodified) through
the OpenAI door's Responses API (the shipped task uses chat completions: both doors carry agents), the agent's first call is made to call the backend's `order_lookup` function tool
(`tool_choice: required`), and about a fifth of the lookups time out under the deadline. The backend
reports the session's outcome with the loophole's "routed" for those, plus the time-out telemetry; the
grader masks each one on the real tool-call traffic; no version trains on them; a candidate planted from
the hack sessions meets the gate (the tiny model answers nothing right, so whatever the gate decides, the
check must agree with the weights service's orders; tools/demo/agent_users.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.demo import cli as demo_cli

pytestmark = pytest.mark.integration


def test_the_quick_agent_demo_masks_every_tool_timeout(
        kafka_bootstrap: str, tiny_model_name: str, tmp_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    task_file = tmp_home / "agent_always_looks_up.yaml"
    task_file.write_text("extends: support_routing\nname: agent_always_looks_up\n"
                         "tool: {kind: function, deadline_s: 0.8, latency_s: [0.0, 1.0], on_timeout: routed}\n"
                         "agent: {max_turns: 3, tool_choice: required, api: responses}\n", encoding="utf-8")
    report_path = tmp_home / "out" / "report.json"
    rc = demo_cli.main(["--task", str(task_file), "--algo", "grpo", "--plant-hack", "--quick", "--model",
                        tiny_model_name, "--report", str(report_path)])
    assert rc == 0
    report = json.loads(report_path.read_text(encoding="utf-8"))
    hack = report["reward_hack"]
    sessions = report["rounds"][1]["deploy"]["answers"]
    assert hack["tool_calls"] == sessions and 0 < hack["tool_timeouts"] < sessions, hack
    assert hack["loophole_kpi_reports"] == hack["tool_timeouts"]
    assert hack["timeouts_masked_by_grader"] == hack["timeouts_graded"] == hack["tool_timeouts"], hack
    assert hack["flagged_and_trained"] == {}, hack
    assert hack["verdict"]["every_timeout_masked"]
    ordered = hack["planted_ordered_to_pods"] == [hack["planted_version"]]
    assert ordered == (hack["planted_status"] == "VERSION_STATUS_PROMOTED"), hack
