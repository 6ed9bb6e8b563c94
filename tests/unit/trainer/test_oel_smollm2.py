"""OEL consolidation on the real SmolLM2-135M-Instruct (slow): invented shop rules the model cannot know;
the teacher sees the relevant rule, its answers that state the fact (the grader's check) become targets,
and the student's loss on the gold answers without the rule in context goes down (docs/oel-probe.md's metric)."""

from __future__ import annotations

import pytest

from services.trainer.distill import DistillExample
from services.trainer.rounds import Trainer
from services.trainer.settings import TrainerSettings
from shared.settings import CommonSettings

pytestmark = pytest.mark.slow

RULES = {
    "The warranty on every Brightlane kettle lasts 14 months.": ("How long is the warranty on a Brightlane kettle?", "14 months"),
    "Returns at Brightlane need form R-22.": ("Which form do I need to return something to Brightlane?", "R-22"),
    "Brightlane billing questions go to phone extension 417.": ("What extension do I call for Brightlane billing?", "417"),
    "Brightlane ships to islands in 9 days.": ("How many days does Brightlane shipping to an island take?", "9 days"),
    "The Brightlane loyalty code is GLOW5.": ("What is the Brightlane loyalty code?", "GLOW5"),
    "Brightlane stores open at 7:30 am.": ("What time do Brightlane stores open?", "7:30"),
}


def test_sft_filtered_consolidation_lowers_gold_answer_loss() -> None:
    settings = TrainerSettings(common=CommonSettings(model="smollm2-135m-instruct"), tenant="acme",
                               distill_method="sft_filtered", distill_batch=6, distill_steps=6,
                               distill_max_new_tokens=24, distill_temperature=0.7, lr=3e-4, retrieval="tfidf",
                               retrieval_items=1, batch_size=12, micro_batch_size=6, seed=0)
    trainer = Trainer(settings)
    examples = [DistillExample([{"role": "user", "content": q}], task="support", reference=a)
                for q, a in RULES.values()]
    accepted: list[str] = []

    def grader(ex: DistillExample, text: str) -> bool:    # the KPI: the answer states the fact
        ok = (ex.reference or "").lower() in text.lower()
        if ok:
            accepted.append(text)
        return ok

    r = trainer.consolidation_round(examples, list(RULES), accept=grader)
    m = r.metrics
    assert r.algorithm == "oel_sft" and accepted, "the teacher with the rule in context must get some right"
    assert m["gold_nll_after"] < m["gold_nll_before"] - 0.1, m
