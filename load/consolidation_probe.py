"""Does a consolidation setting put a task's facts into the weights? One round, offline (no Kafka), measured
weights-only on the task's held-out questions before and after, in the same run.

Knowledge is what the loop would hold after one deployment round in which every answer failed: one item per
fact, the backend's correction, carrying the training questions the users asked. The deployment prompts are
those training questions. The round runs the trainer's own code (`rounds.Trainer.consolidation_round`) with
the chosen method and update, then the held-out questions (never trained on, and excluded from the drills)
are answered greedily without knowledge and checked with the task file's answer check (the evaluation's
oracle: it judges, it never filters training data). OOD: the task's out-of-distribution questions, and the
share of repeated 3-grams in the held-out answers.

    python load/consolidation_probe.py --task support_desk --method sft_items --finetune full --lr 5e-5 --steps 40

Prints a row per setting: held-out before → after (greedy, of N), OOD before → after, repetition, kept/sampled
teacher answers, seconds of sampling and of training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="support_desk", help="a shipped task name or a task file")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--method", default="sft_items")
    ap.add_argument("--finetune", default="full", choices=("full", "lora"))
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--paraphrases", type=int, default=3)
    ap.add_argument("--replay-share", type=float, default=0.25)
    ap.add_argument("--teacher-samples", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="append the row as a JSON line to this file")
    ns = ap.parse_args(argv)

    import torch
    import yaml

    from services.trainer.distill import DistillExample, gold_nll
    from services.trainer.rounds import Trainer
    from services.trainer.settings import FullFinetune, LoraFinetune, TrainerSettings
    from shared.decoding.chat_template import encode_chat
    from shared.decoding.generation import generate
    from shared.decoding.repetition import repetition_rate
    from shared.settings import CommonSettings
    from tools.tasks.task import check_answer, check_ood, load_task

    task = load_task(ns.task)
    train, held = task.train_questions(), task.held_out_questions()
    by_fact: dict[str, list[str]] = {}
    for f, q in train:
        by_fact.setdefault(f.id, []).append(q)
    facts = {f.id: f for f, _ in train}
    examples = [DistillExample(messages=task.messages(q), task=task.task) for _, q in train]
    exclude = Path(tempfile.mkdtemp()) / "heldout.txt"
    exclude.write_text("".join(q + "\n" for _, q in held), encoding="utf-8")
    finetune = (FullFinetune(kind="full") if ns.finetune == "full"
                else LoraFinetune(kind="lora", rank=ns.rank, alpha=2 * ns.rank))
    settings = TrainerSettings(tenant=task.tenant, distill_method=ns.method, finetune=finetune, lr=ns.lr,
                               distill_steps=ns.steps, distill_batch=ns.batch, seed=ns.seed,
                               distill_paraphrases=ns.paraphrases, distill_replay_share=ns.replay_share,
                               teacher_samples=ns.teacher_samples, distill_temperature=ns.temperature,
                               distill_max_new_tokens=ns.max_new_tokens, distill_exclude_questions=exclude,
                               retrieval="tfidf", retrieval_items=1,
                               common=CommonSettings(model=ns.model, torch_threads=os.cpu_count() or 2))
    trainer = Trainer(settings)
    tok = trainer.tokenizer

    @torch.no_grad()
    def evaluate() -> dict[str, Any]:
        model = trainer.model
        was = model.training
        model.eval()
        qs = [(f, q) for f, q in held]
        prompts = [encode_chat(tok, task.messages(q)).ids for _, q in qs]
        outs = generate(model, tok, prompts, max_new_tokens=ns.max_new_tokens, temperature=0.0)
        ok = sum(check_answer(f, o[0].text).value >= 1 for (f, _), o in zip(qs, outs, strict=True))
        rep = sum(repetition_rate(o[0].token_ids) for o in outs) / max(len(outs), 1)
        ood_prompts = [encode_chat(tok, [{"role": "user", "content": i.question}]).ids for i in task.out_of_distribution]
        ood_outs = generate(model, tok, ood_prompts, max_new_tokens=ns.max_new_tokens, temperature=0.0) if ood_prompts else []
        ood_ok = sum(check_ood(i, n, o[0].text).value >= 1
                     for n, (i, o) in enumerate(zip(task.out_of_distribution, ood_outs, strict=True)))
        tokens = sum(len(o[0].token_ids) for o in outs) / max(len(outs), 1)
        model.train(was)
        # the gate's OOD reference check: nats/token of plain reference answers to general prompts
        ref_nll = gold_nll(trainer.policy, references) or 0.0
        return {"held": ok, "held_n": len(qs), "ood": ood_ok, "ood_n": len(ood_prompts), "repetition": rep,
                "ref_nll": ref_nll,
                "mean_tokens": tokens, "examples": [o[0].text for o in outs[:3]]}

    ood_file = Path(__file__).resolve().parents[1] / "services/weights/evalsets/ood.yaml"
    references = [DistillExample(messages=[{"role": "user", "content": i["prompt"]}], reference=i["answer"])
                  for i in yaml.safe_load(ood_file.read_text(encoding="utf-8"))["items"] if i.get("answer")]
    before = evaluate()
    t0 = time.perf_counter()
    items = [facts[fid].correction for fid in by_fact]
    # the items carry the questions they were learned from, as the extractor's do
    from services.trainer.knowledge import KnowledgeBase
    from shared.proto.apprentice.v1 import events_pb2

    kb = KnowledgeBase(task.tenant)
    snap = events_pb2.KnowledgeSnapshot(key=f"{task.tenant}/{task.task}", version=1)
    snap.envelope.tenant = task.tenant
    for n, fid in enumerate(by_fact):
        snap.items.add(item_id=f"i{n}", text=facts[fid].correction, questions=by_fact[fid],
                       status=events_pb2.ITEM_STATUS_APPROVED)
    kb.apply(snap)
    result = trainer.consolidation_round(examples, kb if ns.method == "sft_items" else items)
    seconds = time.perf_counter() - t0
    after = evaluate()
    m = result.metrics
    row = {"task": task.name, "method": ns.method, "finetune": ns.finetune, "lr": ns.lr, "steps": int(m.get("steps", 0)),
           "batch": ns.batch, "paraphrases": ns.paraphrases, "replay_share": ns.replay_share,
           "held_before": before["held"], "held_after": after["held"], "held_n": before["held_n"],
           "ood_before": before["ood"], "ood_after": after["ood"], "ood_n": before["ood_n"],
           "rep_before": round(before["repetition"], 3), "rep_after": round(after["repetition"], 3),
           "ood_ref_nll_before": round(before["ref_nll"], 4), "ood_ref_nll_after": round(after["ref_nll"], 4),
           "tokens_before": round(before["mean_tokens"], 1), "tokens_after": round(after["mean_tokens"], 1),
           "accepted": m.get("accepted"), "samples": m.get("samples"), "questions": m.get("questions"),
           "generated_questions": m.get("generated_questions"), "fallback": m.get("fallback_targets"),
           "gen_s": round(m.get("gen_seconds", 0.0), 1), "seconds": round(seconds, 1),
           "examples_after": after["examples"]}
    print(f"{task.name} {ns.method} {ns.finetune} lr={ns.lr} steps={row['steps']}: held-out {before['held']} -> "
          f"{after['held']}/{before['held_n']}, OOD {before['ood']} -> {after['ood']}/{before['ood_n']}, "
          f"repetition {row['rep_before']} -> {row['rep_after']}, OOD reference nats/token "
          f"{row['ood_ref_nll_before']} -> {row['ood_ref_nll_after']}, tokens {row['tokens_before']} -> "
          f"{row['tokens_after']}, kept {m.get('accepted')}/{m.get('samples')} teacher answers "
          f"({m.get('questions')} questions, {m.get('generated_questions')} generated, {m.get('fallback_targets')} "
          f"fallbacks), sampling {row['gen_s']} s, round {row['seconds']} s")
    for e in after["examples"]:
        print("   after:", e[:160].replace("\n", " "))
    if ns.json:
        with open(ns.json, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
