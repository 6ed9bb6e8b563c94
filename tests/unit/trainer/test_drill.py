"""The `sft_items` consolidation (services/trainer/drill.py) on the real tiny model: questions per item from
the record, the deployment prompts and paraphrases, never a held-out one; targets kept only when they hold the
item's answer terms (else the item's text); a replay share of general prompts that are not the gate's OOD
questions; one tenant's items only."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import yaml

from services.trainer.distill import DistillExample, context_from_base
from services.trainer.drill import (
    DrillItem,
    DrillPair,
    DrillStats,
    batches,
    drill_plan,
    drill_questions,
    excluded_questions,
    parse_paraphrases,
)
from services.trainer.knowledge import KnowledgeBase
from services.trainer.replay_prompts import REPLAY_PROMPTS
from services.trainer.rounds import Trainer
from services.trainer.settings import TrainerSettings
from shared.proto.apprentice.v1 import events_pb2
from shared.settings import CommonSettings

REPO = Path(__file__).resolve().parents[3]
SYSTEM = "You are the support assistant of a bike shop."


def snapshot(tenant: str, items: list[tuple[str, list[str]]], version: int = 1) -> events_pb2.KnowledgeSnapshot:
    snap = events_pb2.KnowledgeSnapshot(key=f"{tenant}/support", version=version)
    snap.envelope.tenant = tenant
    for n, (text, questions) in enumerate(items):
        snap.items.add(item_id=f"{tenant}-{n}", text=text, questions=questions, status=events_pb2.ITEM_STATUS_APPROVED)
    return snap


def test_paraphrases_are_parsed_as_questions() -> None:
    text = ("1. What form do I need for a return?\n- Which form is it for returns?\nSure, here you go:\n"
            "Q3: Which form do I need to return something?\n* What form do I need for a return?\nok?")
    got = parse_paraphrases(text, "Which form do I need to return something?", limit=5)
    assert got == ["What form do I need for a return?", "Which form is it for returns?"]
    assert parse_paraphrases(text, "x", limit=1) == ["What form do I need for a return?"]


def test_a_held_out_question_is_never_a_drill_question(tiny_model_name: str) -> None:
    """Whether it came from the item's record, a user's deployment prompt or a paraphrase, a question of the
    exclusion list (the evaluation's held-out set) is dropped, compared on lower-cased words."""
    from shared.models import load_model

    model, tok = load_model(tiny_model_name)
    held = "How long is the warranty on a frame?"
    items = [DrillItem.of("Frames have a 7-year warranty.", ["What warranty do frames have?", held]),
             DrillItem.of("Returns need form R-22.", ["Which form for returns?"])]
    stats = DrillStats()
    qs = drill_questions(model, tok, items, {0: ["how long is the WARRANTY on a frame"], 1: ["Which form?"]},
                         paraphrases=2, exclude={"how long is the warranty on a frame"}, seed=0, stats=stats)
    assert held not in qs[0] and not any("warranty on a frame" in q.lower() for q in qs[0])
    assert "What warranty do frames have?" in qs[0] and qs[1][:2] == ["Which form for returns?", "Which form?"]
    assert stats.excluded_questions == 1                      # the two spellings are one question


def test_batches_mix_replay_and_cycle_the_pool() -> None:
    pool = [DrillPair(i, [i], [i]) for i in range(5)]
    replay = [DrillPair(-1, [100 + i], [0]) for i in range(8)]
    got = batches(pool, replay, steps=4, batch=4, replay_share=0.25, seed=1)
    assert len(got) == 4 and all(len(b) == 4 for b in got)
    assert all(sum(r.item < 0 for r in b) == 1 for b in got)               # one replay row of four
    drilled = [r.item for b in got for r in b if r.item >= 0]
    assert sorted(drilled[:5]) == [0, 1, 2, 3, 4]                          # every pair once before any twice
    assert all(sum(r.item < 0 for r in b) == 0 for b in batches(pool, [], 2, 4, 0.25, 0))


def test_replay_prompts_are_not_the_gates_ood_questions() -> None:
    ood = yaml.safe_load((REPO / "services/weights/evalsets/ood.yaml").read_text(encoding="utf-8"))
    gate = {i["prompt"].strip().lower() for i in ood["items"]}
    assert len(REPLAY_PROMPTS) >= 24 and not {p.lower() for p in REPLAY_PROMPTS} & gate


def test_plan_takes_this_tenants_items_and_who_asked(tmp_path: Path) -> None:
    kb = KnowledgeBase("acme")
    assert kb.apply(snapshot("acme", [("Frames have a 7-year warranty.", ["What warranty do frames have?"]),
                                      ("Returns need form R-22.", ["Which form for returns?"])]))
    assert not kb.apply(snapshot("globex", [("Globex secret code is 99-XYZ.", ["What is the code?"])]))
    asks = [DistillExample([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], task="support")
            for q in ("how many years of warranty on a frame?", "what form do returns need?")]
    plan = drill_plan(asks, kb, context_from_base(kb, "tfidf", 1), seed=0)
    assert [it.text for it in plan.items] == ["Frames have a 7-year warranty.", "Returns need form R-22."]
    assert not any("99-XYZ" in it.text for it in plan.items)              # never another tenant's item
    assert plan.items[0].terms == ("7-year",) and plan.items[1].terms == ("R-22",)
    assert plan.asked == {0: ["how many years of warranty on a frame?"], 1: ["what form do returns need?"]}
    assert plan.system(0) == plan.system(1) == SYSTEM
    f = tmp_path / "held.txt"
    f.write_text("one?\n\n two? \n", encoding="utf-8")
    assert excluded_questions(f) == ["one?", "two?"] and excluded_questions(None) == []


def test_a_round_trains_on_term_holding_targets_or_the_items_text(tiny_model_name: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The random tiny model's answers never hold an item's terms, so every question falls back to the item's
    own text; the round trains `steps` steps with the replay share, and excluded questions never train."""
    from shared.models import load_model

    model, tok = load_model(tiny_model_name)
    held = tmp_path / "held.txt"
    held.write_text("What warranty do frames have?\n", encoding="utf-8")
    s = TrainerSettings(common=CommonSettings(model="tiny-random"), tenant="acme", lr=1e-3, distill_method="sft_items",
                        distill_batch=4, distill_steps=3, distill_max_new_tokens=6, micro_batch_size=2,
                        distill_paraphrases=1, distill_replay_share=0.25, teacher_samples=2, retrieval="tfidf",
                        retrieval_items=1, distill_exclude_questions=held)
    t = Trainer(s, model=copy.deepcopy(model), tokenizer=tok)
    t.knowledge.apply(snapshot("acme", [("Frames have a 7-year warranty.", ["What warranty do frames have?",
                                                                            "How long are frames covered?"]),
                                        ("Returns need form R-22.", ["Which form for returns?"])]))
    seen: list[list[int]] = []
    import services.trainer.rounds as rounds

    real_step = rounds.distill_step

    def spy(policy, teacher, s_ids, t_ids, ys, from_teacher, cfg, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.extend(list(p) for p in s_ids)
        return real_step(policy, teacher, s_ids, t_ids, ys, from_teacher, cfg, **kw)

    monkeypatch.setattr(rounds, "distill_step", spy)
    r = t.consolidation_round([DistillExample([{"role": "user", "content": "Which form for returns?"}], task="support")])
    m = r.metrics
    assert r.algorithm == "oel_drill" and m["steps"] == 3 and t.policy.steps == 3
    assert m["excluded_questions"] >= 1 and m["accepted"] == 0 and m["fallback_targets"] == m["questions"] >= 2
    texts = {tok.decode(p) for p in seen}
    assert not any("What warranty do frames have?" in x for x in texts)       # the held-out question never trains
    assert any("How long are frames covered?" in x for x in texts)


def test_answers_without_the_terms_fall_back_to_the_items_text(tiny_model_name: str) -> None:
    """Teacher samples that do not hold the item's answer terms are not targets; the item's text is."""
    from services.trainer.drill import drill_pairs
    from shared.models import load_model

    model, tok = load_model(tiny_model_name)
    item = DrillItem.of("Code 4410.", ["Which code?"])
    stats = DrillStats()
    pairs = drill_pairs(model, tok, [item], [["Which code?"]], lambda i: "", samples=3, temperature=1.0,
                        max_new_tokens=4, max_repetition=1.0, seed=random.Random(0).randrange(1000), stats=stats)
    # a random model does not write "4410": every pair is the fallback, the item's own text
    assert stats.sampled == 3 and stats.kept == 0 and stats.fallback == 1
    assert len(pairs) == 1 and "4410" in tok.decode(pairs[0].target)
    assert item.terms == ("4410",)


def test_the_gates_check_questions_are_never_drilled() -> None:
    """Every third distinct recorded question is the gate's (shared/knowledge/check_questions.py): the drill
    neither trains on it nor paraphrases it, and the gate asks only those; with fewer than three, all do both."""
    from services.weights.knowledge import checks_of
    from shared.knowledge.check_questions import split_questions

    qs = ["Which form for returns?", "which form for returns", "What form do I return with?", "Return form code?",
          "Form to send things back?", "Which paper for a return?", "Returns: which form?"]
    train, check = split_questions(qs)
    assert check == ["Return form code?", "Returns: which form?"]
    assert train == ["Which form for returns?", "What form do I return with?", "Form to send things back?",
                     "Which paper for a return?"]
    assert split_questions(qs[:3]) == (qs[:1] + qs[2:3], qs[:1] + qs[2:3])        # two distinct: nothing spared
    item = DrillItem.of("Returns need form R-22.", qs)
    assert item.checks == ("Return form code?", "Returns: which form?") and not set(item.checks) & set(item.questions)
    snap = snapshot("acme", [("Returns need form R-22.", qs)])
    snap.items[0].answer_terms.append("R-22")
    [gate] = checks_of(snap, "acme/support")
    assert set(gate.questions) == set(check)
    plan_asked = {0: ["Return form code?", "Which form for returns?"]}
    stats = DrillStats()
    from shared.models import load_model

    model, tok = load_model("tiny-random")
    got = drill_questions(model, tok, [item], plan_asked, paraphrases=0,
                          exclude={"return form code", "returns which form"}, seed=0, stats=stats)
    assert got == [train]
