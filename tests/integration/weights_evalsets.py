"""Small eval sets shared by the weights integration tests: the gate runs for real, quickly."""

from __future__ import annotations

from pathlib import Path

SMALL_HELDOUT = """
name: small-heldout
graders: [{name: fact, type: contains, reference_key: answer, ignore_case: true}]
items:
  - {prompt: "Which form do I need to return something?", reference: {answer: "RF-7734"}}
  - {prompt: "What extension reaches support?", reference: {answer: "4410"}}
"""
SMALL_OOD = """
name: small-ood
items:
  - {prompt: "What is the capital of France?", answer: "The capital of France is Paris.",
     check: {type: contains, any_of: [Paris]}}
  - {prompt: "How many days are in a week?", answer: "There are seven days in a week."}
"""


def small_eval_sets(tmp: Path) -> dict[str, Path]:
    """Two-item eval sets: the gate runs for real, in a fraction of the default sets' time."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "heldout.yaml").write_text(SMALL_HELDOUT)
    (tmp / "ood.yaml").write_text(SMALL_OOD)
    return {"eval_set": tmp / "heldout.yaml", "ood_set": tmp / "ood.yaml"}
