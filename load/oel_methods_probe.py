"""Which consolidation objective moves held-out answers on the demo task? Measures each method on the same
start model, knowledge and prompts, in one run.

Knowledge is what the extractor derives from one deployment round in which every answer failed: for each
training question, `When asked "<q>", answer: <the human correction>`. Deployment prompts are the training
questions without knowledge. After every `--eval-every` steps the held-out questions (never trained on)
are answered greedily without knowledge, and the gold-answer loss (nats/token of the fact) is measured.

    python load/oel_methods_probe.py --model smollm2-135m-instruct --methods rkl_topk,gkd,sft_filtered --steps 20

Prints one row per (method, lr, step): held-out greedy successes / 20, gold NLL, seconds; and the
baseline row (step 0, identical for every method).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--methods", default="rkl_topk,gkd,sft_filtered")
    ap.add_argument("--lrs", default="5e-5,2e-4")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--finetune", default="lora")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--filter", choices=("confidence", "verifier"), default="confidence",
                    help="sft_filtered: keep confident teacher samples, or those the task's answer check passes")
    ap.add_argument("--teacher-samples", type=int, default=1, help="sft_filtered: teacher samples per prompt")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of student/teacher")
    ns = ap.parse_args(argv)
    os.environ.setdefault("APPRENTICE_TRAINER_TENANT", "demo")

    import torch

    from services.trainer.distill import DistillConfig, DistillExample
    from services.trainer.rounds import Trainer
    from services.trainer.settings import FullFinetune, LoraFinetune, TrainerSettings
    from shared.decoding.generation import encode_prompt, generate, render_chat
    from shared.decoding.logprobs import sequence_logprobs
    from shared.models import load_model
    from tools.tasks.task import check_answer, load_task

    task = load_task("support_desk")
    train, held = task.train_questions(), task.held_out_questions()
    items = [f'When asked "{q}", answer: {f.correction}' for f, q in train]
    examples = [DistillExample(messages=task.messages(q), task=task.task) for _, q in train]
    base, tok = load_model(ns.model)

    @torch.no_grad()
    def evaluate(model: torch.nn.Module) -> tuple[int, float]:
        model.eval()
        prompts = [render_chat(tok, task.messages(q)) for _, q in held]
        outs = generate(model, tok, prompts, max_new_tokens=ns.max_new_tokens)
        ok = sum(check_answer(f, o[0].text).value >= 1 for (f, _), o in zip(held, outs, strict=True))
        nll = []
        for (f, _), p in zip(held, prompts, strict=True):
            ids = tok(f.fact + "<|im_end|>", add_special_tokens=False)["input_ids"]
            nll.append(-sequence_logprobs(model, encode_prompt(tok, p), ids).mean().item())
        return int(ok), sum(nll) / len(nll)

    print(f"{'method':<14} {'lr':>8} {'step':>5} {'held-out':>9} {'gold NLL':>9} {'seconds':>8}", flush=True)
    ok, nll = evaluate(base)
    print(f"{'(start)':<14} {'-':>8} {0:>5} {ok:>6}/{len(held)} {nll:>9.3f} {0:>8.0f}", flush=True)
    for method in ns.methods.split(","):
        for lr in (float(x) for x in ns.lrs.split(",")):
            base, _ = load_model(ns.model)  # peft wraps layers in place: start each run from a fresh copy
            verifier = ("tools.tasks.task:verify_training_answer", {"task": "support_desk"}) \
                if ns.filter == "verifier" else ("", {})
            finetune = FullFinetune(kind="full") if ns.finetune == "full" else LoraFinetune()
            settings = TrainerSettings(distill_method=method, lr=lr, finetune=finetune, device=ns.device,
                                       distill_batch=ns.batch, distill_max_new_tokens=ns.max_new_tokens,
                                       sft_verifier=verifier[0], sft_verifier_params=verifier[1],
                                       teacher_samples=ns.teacher_samples, distill_temperature=ns.temperature)
            trainer = Trainer(settings, model=base, tokenizer=tok)
            t0, done = time.time(), 0
            while done < ns.steps:
                chunk = min(ns.eval_every, ns.steps - done)
                cfg = DistillConfig(**{**trainer.distill_cfg.__dict__, "steps": chunk})
                r = trainer.consolidation_round(examples, items, config=cfg)
                done += chunk
                acc = f"accepted {r.metrics['accepted']:.0f}/{r.metrics['samples']:.0f}" if method == "sft_filtered" else ""
                ok, nll = evaluate(trainer.model)
                print(f"{method:<14} {lr:>8.0e} {done:>5} {ok:>6}/{len(held)} {nll:>9.3f} {time.time() - t0:>8.0f}  {acc}",
                      flush=True)
            del trainer
    return 0


if __name__ == "__main__":
    sys.exit(main())
