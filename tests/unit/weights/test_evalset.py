"""Eval sets: the packaged defaults load (the demo task's held-out split), and bad files say what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.weights.evalset import EvalSetError, load_heldout, load_ood
from services.weights.settings import WeightsSettings

REPO = Path(__file__).resolve().parents[3]


def test_packaged_defaults_use_the_demo_tasks_held_out_split() -> None:
    task = yaml.safe_load((REPO / "tools/tasks/support_desk.yaml").read_text())
    keep = task["held_out_per_fact"]
    h = load_heldout()
    # every fact's last `held_out_per_fact` questions (never trained on), graded by the fact's own check
    assert [it.prompt for it in h.spec.items] == [q for f in task["facts"] for q in f["questions"][-keep:]]
    assert [g[0].name for g in h.graders] == [f["id"] for f in task["facts"] for _ in range(keep)]
    assert h.spec.system == task["system_prompt"]
    ood, digest = load_ood()
    assert sum(i.answer is not None for i in ood.items) == 8
    # the 40 packaged general questions with checks, then the task file's own OOD questions
    assert sum(i.check is not None for i in ood.items) == 40 + len(task["out_of_distribution"])
    assert len(digest) == 16


def test_grader_config_supplies_rule_graders(tmp_path: Path) -> None:
    (tmp_path / "graders.yaml").write_text("""
version: t1
tasks:
  - tenant: "*"
    task: support
    graders:
      - {name: fact, type: contains, reference_key: answer, ignore_case: true}
      - {name: thumbs, type: feedback, kind: thumbs}
""")
    (tmp_path / "set.yaml").write_text("""
grader_config: graders.yaml
task: support
items: [{prompt: "q?", reference: {answer: "A-1"}}]
""")
    h = load_heldout(tmp_path / "set.yaml")
    assert [g.name for g in h.graders[0]] == ["fact"]  # only rule graders: feedback cannot judge offline


@pytest.mark.parametrize(("text", "message"), [
    ("items: []", "no items"),
    ("items: [{prompt: q}]", "item 0 has no rule graders"),
    ("items: [{prompt: q, messages: [{role: user, content: x}], graders: [{name: a, type: regex, pattern: x}]}]",
     "exactly one of `prompt` or `messages`"),
    ("graders: [{name: a, type: contains}]\nitems: [{prompt: q}]", "needs `any_of`, `all_of` or `reference_key`"),
    ("task_file: nowhere.yaml", "cannot read task file"),
    ("items: [{prompt: q, graders: [{name: a, type: nonsense}]}]", "invalid rule grader"),
])
def test_invalid_heldout_sets(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "set.yaml").write_text(text)
    with pytest.raises(EvalSetError, match=message):
        load_heldout(tmp_path / "set.yaml")


def test_invalid_ood_set(tmp_path: Path) -> None:
    (tmp_path / "ood.yaml").write_text("items: [{prompt: q}]")
    with pytest.raises(EvalSetError, match="needs a reference `answer`, a rule `check`, or both"):
        load_ood(tmp_path / "ood.yaml")


def test_settings_validation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPRENTICE_HOME", str(tmp_path))
    s = WeightsSettings()
    assert s.port == 50052 and s.metrics_port == 9105 and s.store_root == tmp_path / "weights"
    for bad in ({"keep_last": 0}, {"canary_fraction": 0}, {"chunk_size": 64 << 20}, {"gate": {"heldout_max_drop": -1}},
                {"policy": "yolo"}):
        with pytest.raises(ValueError):
            WeightsSettings(**bad)  # type: ignore[arg-type]
