"""Trainer throughput: tokens/s of one update, Apprentice vs baselines measured in the same run.

1) GRPO update: Apprentice `rl.rl_round` vs TRL `GRPOTrainer` (its own loss: `compute_loss`, the
   accelerator's backward, grad clipping, AdamW step), same model, LoRA config, group size, batch,
   prompt/completion lengths and token ids, loss_type "grpo", beta 0, one optimizer step per batch.
   Generation is EXCLUDED from both: the same pre-sampled completions are fed to each.
2) OEL distillation step: Apprentice `distill.distill_step` (fused top-k reverse KL, k=256) vs a
   straightforward full-vocabulary reverse KL (materialised logits + log_softmax for student and
   teacher), and vs the same top-k objective on materialised logits. Teacher = frozen copy with a
   knowledge prefix in its prompt. Generation excluded.

Tokens = completion tokens per update. Each configuration runs `--reps` times, interleaved with its
baseline (A B A B ...) so that background load hits both alike; the median is reported.

    .venv/bin/python load/trainer_bench.py                      # tiny-random, CPU
    .venv/bin/python load/trainer_bench.py --model smollm2-135m-instruct --device cuda
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from services.trainer import losses  # noqa: E402
from services.trainer.batching import make_batch  # noqa: E402
from services.trainer.distill import DistillConfig, distill_step  # noqa: E402
from services.trainer.policy import Policy, PolicyConfig  # noqa: E402
from services.trainer.rl import RLConfig, RunningBaseline, rl_round  # noqa: E402
from services.trainer.rollouts import Rollout  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Any, device: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process): on a shared CPU the second is steadier."""
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def make_data(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[list[int]], list[float]]:
    rng = random.Random(args.seed)
    B = args.prompts * args.group
    prompts = []
    for _ in range(args.prompts):
        p = [rng.randrange(100, vocab - 100) for _ in range(args.prompt_len)]
        prompts += [p] * args.group
    comps = [[rng.randrange(100, vocab - 100) for _ in range(rng.randint(args.completion_len // 2, args.completion_len))]
             for _ in range(B)]
    rewards = [float(rng.random() < 0.5) for _ in range(B)]
    return prompts, comps, rewards


def lora_config(args: argparse.Namespace) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


# --- GRPO ------------------------------------------------------------------------------------------------


def trl_grpo(args: argparse.Namespace, base: Any, tok: Any, prompts: list[list[int]], comps: list[list[int]],
             adv: torch.Tensor, tmp: Path) -> Any:
    """A TRL GRPOTrainer and a closure doing one update on the given (already generated) batch."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    B = len(prompts)
    cfg = GRPOConfig(output_dir=str(tmp / "trl"), per_device_train_batch_size=B, num_generations=args.group,
                     max_completion_length=args.completion_len, loss_type="grpo", beta=0.0, learning_rate=args.lr,
                     max_grad_norm=1.0, report_to=[], use_cpu=args.device == "cpu", bf16=args.device != "cpu",
                     gradient_accumulation_steps=1, num_iterations=1, logging_steps=10**9, save_strategy="no",
                     seed=args.seed)
    def no_reward(completions: list[Any], **kw: Any) -> list[float | None]:
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=copy.deepcopy(base), reward_funcs=no_reward,
                          args=cfg, train_dataset=Dataset.from_dict({"prompt": ["x"] * B}), processing_class=tok,
                          peft_config=lora_config(args) if args.finetune == "lora" else None)
    optimizer = trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    model, dev = trainer.model, trainer.accelerator.device
    assert model is not None  # the trainer holds the (LoRA-wrapped) copy of `base`
    P, C = max(map(len, prompts)), max(map(len, comps))
    pad = tok.pad_token_id
    pid = torch.full((B, P), pad)
    pm = torch.zeros((B, P), dtype=torch.long)
    cid = torch.full((B, C), pad)
    cm = torch.zeros((B, C), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
        pid[i, P - len(p):], pm[i, P - len(p):] = torch.tensor(p), 1          # TRL left-pads prompts
        cid[i, :len(c)], cm[i, :len(c)] = torch.tensor(c), 1
    inputs = {"prompt_ids": pid.to(dev), "prompt_mask": pm.to(dev), "completion_ids": cid.to(dev),
              "completion_mask": cm.to(dev), "advantages": adv.to(dev), "old_per_token_logps": None,
              "num_items_in_batch": cm.sum().to(dev)}
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        model.train()
        loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step.trainer, step.inputs = trainer, inputs  # type: ignore[attr-defined]
    return step


def ours_grpo(args: argparse.Namespace, base: Any, tok: Any, prompts: list[list[int]], comps: list[list[int]],
              rewards: list[float]) -> Any:
    policy = Policy(PolicyConfig(args.model, finetune=args.finetune, lr=args.lr, device=args.device,
                                 head_chunk=args.chunk), model=copy.deepcopy(base), tokenizer=tok)
    with torch.no_grad():                     # behaviour log-probs as inference would record them (IS active)
        b = make_batch(prompts, comps, policy.pad_id).to(policy.device)
        lp = policy.scorer(b).float().cpu()
    rollouts, k = [], 0
    for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
        rollouts.append(Rollout(str(i), p, c, rewards[i], group_id=f"g{i // args.group}", group_size=args.group,
                                behaviour_logprobs=lp[k:k + len(c)].tolist()))
        k += len(c)
    cfg = RLConfig(algorithm="grpo", batch_size=len(rollouts), micro_batch_size=args.micro or len(rollouts))
    baseline = RunningBaseline()

    def step() -> None:
        rl_round(policy, rollouts, cfg, baseline)
    step.policy = policy  # type: ignore[attr-defined]
    return step


def captured_grads(policy: Policy, step: Any) -> torch.Tensor:
    """Run `step` with the optimizer step replaced by a snapshot of the gradients."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    captured: list[torch.Tensor] = []
    real_step = policy.step

    def capture() -> float:
        captured.append(torch.cat([p.grad.flatten().float() for p in params]))
        policy.optimizer.zero_grad(set_to_none=True)
        return 0.0
    policy.step = capture  # type: ignore[method-assign]
    try:
        step()
    finally:
        policy.step = real_step  # type: ignore[method-assign]
    return captured[0]


def compare(a: torch.Tensor, b: torch.Tensor) -> str:
    a, b = a.double(), b.double().to(a.device)
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    rel = float((a - b).norm() / a.norm().clamp(min=1e-30))
    return f"grad cosine {cos:.6f}, relative L2 difference {rel:.2e}"


def distill_parity(plain_step: Any, our_step: Any) -> str:
    """The fused top-k RKL against the same objective on materialised logits, same weights."""
    with torch.no_grad():
        for p, q in zip(plain_step.policy.model.parameters(), our_step.policy.model.parameters(), strict=True):
            p.copy_(q)
    return "parity vs materialised top-k (same weights, one backward): " + compare(
        captured_grads(plain_step.policy, plain_step), captured_grads(our_step.policy, our_step))


def grpo_parity(trl_step: Any, our_step: Any) -> str:
    """Same trainable weights in both (ours copied into TRL's model), one backward each, no update:
    the two losses and gradients must agree, or the speed comparison would be meaningless."""
    trainer, inputs, policy = trl_step.trainer, trl_step.inputs, our_step.policy
    tm = trainer.model
    ours = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for n, p in tm.named_parameters():
            if p.requires_grad:
                p.copy_(ours[n])
    tm.train()
    loss_trl = trainer.compute_loss(tm, inputs)
    trainer.accelerator.backward(loss_trl)
    g_trl = torch.cat([p.grad.flatten().float() for n, p in tm.named_parameters() if p.requires_grad])
    trainer.optimizer.zero_grad(set_to_none=True)
    return "parity vs TRL (same weights, one backward): " + compare(g_trl, captured_grads(policy, our_step))


# --- distillation ---------------------------------------------------------------------------------------


def distill_setups(args: argparse.Namespace, base: Any, tok: Any, prompts: list[list[int]],
                   comps: list[list[int]]) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    knowledge = [rng.randrange(100, 40000) for _ in range(args.knowledge_len)]
    t_prompts = [knowledge + p for p in prompts]
    steps: dict[str, Any] = {}

    def fresh() -> Policy:
        return Policy(PolicyConfig(args.model, finetune=args.finetune, lr=args.lr, device=args.device,
                                   head_chunk=args.chunk), model=copy.deepcopy(base), tokenizer=tok)

    ours = fresh()
    teacher = ours.snapshot()
    cfg = DistillConfig(topk=args.topk, micro_batch_size=args.micro or len(prompts))
    def our_step() -> None:
        distill_step(ours, teacher, prompts, t_prompts, comps, [False] * len(comps), cfg)
    our_step.policy = ours  # type: ignore[attr-defined]
    steps["apprentice: fused top-k RKL"] = our_step

    def plain(objective: str) -> Any:
        pol = fresh()
        t = pol.snapshot()
        bs = make_batch(prompts, comps, pol.pad_id).to(pol.device)
        bt = make_batch(t_prompts, comps, pol.pad_id).to(pol.device)
        Ls, Lt = bs.input_ids.shape[1], bt.input_ids.shape[1]

        def step() -> None:
            with pol.autocast():
                with torch.no_grad():
                    tl = t(input_ids=bt.input_ids).logits[bt.rows, bt.cols].float()          # (N, V)
                sl = pol.model(input_ids=bs.input_ids).logits[bs.rows, bs.cols].float()      # (N, V)
                per = (losses.full_reverse_kl(sl, tl) if objective == "full"
                       else losses.topk_reverse_kl(sl, tl, args.topk))
                loss = per.mean()
            loss.backward()
            pol.step()
        del Ls, Lt
        step.policy = pol  # type: ignore[attr-defined]
        return step

    steps["baseline: full-vocab RKL"] = plain("full")
    steps["baseline: top-k RKL, materialised"] = plain("topk")
    return steps


# --- driver -----------------------------------------------------------------------------------------------


def run_pairs(named: dict[str, Any], reps: int, device: str) -> dict[str, tuple[float, float]]:
    for fn in named.values():                 # warm-up (allocator, kernels, lazy init)
        timed(fn, device)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in named}
    for _ in range(reps):
        for k, fn in named.items():
            times[k].append(timed(fn, device))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}


def table(title: str, secs: dict[str, tuple[float, float]], tokens: int, baseline: str) -> None:
    print(f"\n{title}  ({tokens} completion tokens per update)")
    print(f"| {'implementation':36s} | {'wall s':>7s} | {'tokens/s':>9s} | {'speed-up':>8s} | {'CPU s':>7s} | {'CPU speed-up':>12s} |")
    print(f"|{'-' * 38}|{'-' * 9}|{'-' * 11}|{'-' * 10}|{'-' * 9}|{'-' * 14}|")
    bw, bc = secs[baseline]
    for k, (w, c) in secs.items():
        print(f"| {k:36s} | {w:7.3f} | {tokens / w:9.1f} | {bw / w:7.2f}x | {c:7.3f} | {bc / c:11.2f}x |")


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """`random:<dir>` = the architecture of <dir>/config.json with random weights (throughput does not
    depend on the weights; lets a GPU run use SmolLM2-135M's shape without its 540 MB of weights)."""
    if not args.model.startswith("random:"):
        from shared.models import load_model

        return load_model(args.model, device=args.device)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = args.model.split(":", 1)[1]
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).to(args.device)
    tok = AutoTokenizer.from_pretrained(src)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random", help="model name, or random:<dir with config.json + tokenizer>")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--finetune", default="lora", choices=["lora", "full"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=128)
    ap.add_argument("--knowledge-len", type=int, default=64)
    ap.add_argument("--topk", type=int, default=256)
    ap.add_argument("--micro", type=int, default=0, help="micro-batch (0 = whole batch, as TRL here)")
    ap.add_argument("--chunk", type=int, default=0, help="LM-head token chunk (0 = by device)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma list: grpo,distill")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    base, tok = load(args)
    prompts, comps, rewards = make_data(args, base.config.vocab_size)
    tokens = sum(map(len, comps))
    print(f"model={args.model} device={args.device} finetune={args.finetune} threads={torch.get_num_threads()} "
          f"batch={len(prompts)} (= {args.prompts} prompts x group {args.group}) prompt_len={args.prompt_len} "
          f"completion_len={args.completion_len // 2}..{args.completion_len} reps={args.reps} (median); "
          "generation excluded from every row")
    skip = set(filter(None, args.skip.split(",")))
    if "grpo" not in skip:
        adv = losses.group_advantages(torch.tensor(rewards), torch.arange(len(rewards)) // args.group)
        with tempfile.TemporaryDirectory() as tmp:
            trl_step = trl_grpo(args, base, tok, prompts, comps, adv, Path(tmp))
            our_step = ours_grpo(args, base, tok, prompts, comps, rewards)
            parity = grpo_parity(trl_step, our_step)
            named = {"TRL GRPOTrainer (loss_type=grpo)": trl_step, "apprentice rl_round (grpo)": our_step}
            secs = run_pairs(named, args.reps, args.device)
        table("GRPO update", secs, tokens, "TRL GRPOTrainer (loss_type=grpo)")
        print(parity)
    if "distill" not in skip:
        named = distill_setups(args, base, tok, prompts, comps)
        parity = distill_parity(named["baseline: top-k RKL, materialised"], named["apprentice: fused top-k RKL"])
        secs = run_pairs(named, args.reps, args.device)
        order = ["baseline: full-vocab RKL", "baseline: top-k RKL, materialised", "apprentice: fused top-k RKL"]
        table(f"OEL distillation step (k={args.topk}, teacher prompt +{args.knowledge_len} knowledge tokens)",
              {k: secs[k] for k in order}, tokens, "baseline: full-vocab RKL")
        print(parity)
    return 0


if __name__ == "__main__":
    sys.exit(main())
