"""Does a stronger small model pay for itself on the demo task? Reading of knowledge vs cost, each model
against the baseline (the first one, SmolLM2-135M-Instruct) measured in the same run.

Per model, on the task's held-out questions (the last `held_out_per_fact` of each fact), greedy, with the
task's system prompt, through the demo's own prompt path (`encode_chat`, `shared.decoding.generation.generate`):

  (a) no knowledge;
  (b) the fact's human correction in context, inside the knowledge frame the trainer's teacher and the
      inference service use (`with_knowledge`);
  (c) the relevant correction plus `--distractors` corrections of other facts, in a seeded order;
  (d) seconds per answer at exactly `--max-new-tokens` new tokens (end of sequence ignored): all held-out
      prompts in one batch (as the inference service batches), and `--alone` prompts one at a time;
  (e) one full fine-tuning step: AdamW, fp32, cross-entropy on the answer tokens, backward, optimizer step,
      on `--train-batch` training questions each followed by its correction (the demo's teacher targets
      are answers of this length); the median of `--train-steps` steps after one warm-up step;
  (f) the demo's wall time relative to the baseline, estimated from (d), (e) and the answer lengths of
      (a)-(c): demo = gen_share * generation + train_share * training + the rest (Kafka, waits, start-up),
      each part scaled by its measured ratio of CPU seconds (one torch thread: the wall clock of a shared
      machine also counts the waits for a core). The shares come from the README's one-round run (720 s:
      366 s of teacher sampling + ~200 s of evaluation and deployment answers, 113 s of 8 training steps).

A model spec `NAME:plain` asks the same questions without a chat template: "<system + knowledge>\\n\\n
Customer: <question>\\nAssistant:", cut at the first newline: what a base (not instruction-tuned) model
can do at best. It shares its model's cost columns.

    OMP_NUM_THREADS=1 .venv/bin/python load/model_probe.py            # ~15 minutes on one thread
    .venv/bin/python load/model_probe.py --models smollm2-135m-instruct,gemma3-270m --train-steps 2

Prints the accuracy table (successes / held-out questions, Wilson 95% interval, and in brackets the
successes left when answers that copy the prompt are not counted: the answer check only looks for the
fact, which an echo of the knowledge contains), the cost table with each ratio to the baseline, and two
answers per condition of every model (`--show`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONDITIONS = ("none", "relevant", "relevant+distractors")


@dataclass
class Cost:
    answer_batched_s: float = 0.0     # per answer, `n` prompts in one batch, exactly max_new_tokens each
    answer_batched_cpu_s: float = 0.0 # the same in process CPU seconds
    answer_alone_s: float = 0.0       # per answer, one prompt at a time
    train_step_s: float = 0.0         # median wall seconds of one step
    train_step_cpu_s: float = 0.0     # the same in process CPU seconds (steadier on a shared machine)
    train_tokens: float = 0.0         # mean sequence length of the training batch
    peak_rss_gib: float = 0.0         # the process's peak resident memory after this model's steps
    load_s: float = 0.0


@dataclass
class ModelResult:
    spec: str
    successes: dict[str, int] = field(default_factory=dict)
    echoes: dict[str, int] = field(default_factory=dict)        # successes that copy the prompt (see `echoes`)
    answer_tokens: dict[str, float] = field(default_factory=dict)
    examples: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    cost: Cost | None = None


def knowledge_frame() -> Any:
    """`with_knowledge` from wherever it lives now (it moved from the trainer to shared/knowledge)."""
    try:
        from shared.knowledge.frame import with_knowledge
    except ImportError:
        from services.trainer.knowledge import with_knowledge  # type: ignore[attr-defined,no-redef]
    return with_knowledge


def contexts(task: Any, n_distractors: int, seed: int) -> dict[str, list[list[str]]]:
    """Per condition, the knowledge items of each held-out question (the same for every model)."""
    rng = random.Random(seed)
    held = task.held_out_questions()
    mixed = []
    for fact, _ in held:
        others = [f.correction for f in task.facts if f.id != fact.id]
        items = [fact.correction, *rng.sample(others, min(n_distractors, len(others)))]
        rng.shuffle(items)
        mixed.append(items)
    return {"none": [[] for _ in held], "relevant": [[f.correction] for f, _ in held],
            "relevant+distractors": mixed}


def prompt_ids(tok: Any, task: Any, question: str, items: list[str], plain: bool) -> list[int]:
    from shared.decoding.chat_template import encode_chat

    with_knowledge = knowledge_frame()
    msgs = with_knowledge(task.messages(question), items)
    if not plain:
        return encode_chat(tok, msgs).ids
    system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
    return list(tok(f"{system}\n\nCustomer: {question}\nAssistant:")["input_ids"])  # the tokenizer's BOS, if any


def accuracy(model: Any, tok: Any, task: Any, ctx: dict[str, list[list[str]]], plain: bool, max_new: int,
             show: int, result: ModelResult) -> None:
    from shared.decoding.generation import generate
    from shared.decoding.params import SamplingConfig
    from tools.tasks.task import check_answer

    held = task.held_out_questions()
    cfg = SamplingConfig(max_new_tokens=max_new, stop=("\n",) if plain else ())
    for cond in CONDITIONS:
        ids = [prompt_ids(tok, task, q, items, plain) for (_, q), items in zip(held, ctx[cond], strict=True)]
        outs = [o[0] for o in generate(model, tok, ids, cfg)]
        ok = [check_answer(f, o.text).value >= 1 for (f, _), o in zip(held, outs, strict=True)]
        result.successes[cond] = sum(ok)
        result.echoes[cond] = sum(k and echoes(task, q, o.text) for k, (_, q), o in zip(ok, held, outs, strict=True))
        result.answer_tokens[cond] = statistics.mean(len(o.token_ids) for o in outs)
        result.examples[cond] = [(q, o.text) for (_, q), o in list(zip(held, outs, strict=True))[:show]]
        print(f"  {result.spec:<26} {cond:<21} {result.successes[cond]:>2}/{len(held)}, "
              f"{result.echoes[cond]} of them echoes", flush=True)


def echoes(task: Any, question: str, text: str) -> bool:
    """Whether an answer copies its prompt (the system prompt, the knowledge frame or the question): a base
    model that echoes the knowledge "states" the fact and passes a contains-check without answering."""
    low = text.lower()
    return any(s.lower() in low for s in (task.system_prompt[:40], "reference-notes", "reference notes", question))


def answer_time(model: Any, tok: Any, prompts: list[list[int]], max_new: int) -> tuple[float, float]:
    """(wall, CPU) seconds to decode `prompts` as one batch, every row exactly `max_new` tokens (no EOS)."""
    from shared.decoding.batch import decode_batch
    from shared.decoding.params import SamplingConfig
    from shared.decoding.rows import DecodeRow

    rows = [DecodeRow(list(p), SamplingConfig(max_new_tokens=max_new)) for p in prompts]
    t0, c0 = time.perf_counter(), time.process_time()
    decode_batch(model, tok, rows, eos_ids=set())
    elapsed = time.perf_counter() - t0, time.process_time() - c0
    assert all(len(r.sample.token_ids) == max_new for r in rows), "a row stopped early"
    return elapsed


def train_batch(tok: Any, task: Any, size: int) -> tuple[Any, Any, Any]:
    """`size` training questions with their corrections as answers --> (input_ids, attention_mask, labels),
    right-padded; labels are -100 outside the answer."""
    import torch

    from shared.decoding.chat_template import encode_chat

    seqs, masks = [], []
    for fact, q in task.train_questions()[:: max(1, len(task.train_questions()) // size)][:size]:
        prompt = encode_chat(tok, task.messages(q)).ids
        full = encode_chat(tok, [*task.messages(q), {"role": "assistant", "content": fact.correction}],
                           add_generation_prompt=False).ids
        n = len(prompt) if full[: len(prompt)] == prompt else 0
        seqs.append(full)
        masks.append([0] * n + [1] * (len(full) - n))
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    labels = torch.tensor([[t if m else -100 for t, m in zip(s, mk, strict=True)] + [-100] * (width - len(s))
                           for s, mk in zip(seqs, masks, strict=True)])
    return ids, attn, labels


def train_step_time(model: Any, tok: Any, task: Any, size: int, steps: int, lr: float) -> tuple[float, float, float]:
    """(median wall s, median CPU s, mean tokens) of full fine-tuning steps; the model's weights change."""
    import torch

    ids, attn, labels = train_batch(tok, task, size)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    wall, cpu = [], []
    for i in range(steps + 1):                         # step 0 allocates the optimizer's state: not timed
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        print(f"    train step {i}: {time.perf_counter() - t0:.1f} s, loss {loss.item():.3f}", flush=True)
    model.eval()
    del opt
    return statistics.median(wall), statistics.median(cpu), float(attn.sum()) / len(attn)


def costs(model: Any, tok: Any, task: Any, ns: argparse.Namespace) -> Cost:
    held = task.held_out_questions()
    prompts = [prompt_ids(tok, task, q, [], False) for _, q in held]
    answer_time(model, tok, prompts[:1], 4)            # warm-up (first-call allocations)
    wall, cpu = answer_time(model, tok, prompts, ns.max_new_tokens)
    batched, batched_cpu = wall / len(prompts), cpu / len(prompts)
    alone = statistics.mean(answer_time(model, tok, [p], ns.max_new_tokens)[0] for p in prompts[: ns.alone])
    print(f"    answer: {batched:.2f} s batched ({batched_cpu:.2f} CPU s), {alone:.2f} s alone", flush=True)
    step, step_cpu, tokens = train_step_time(model, tok, task, ns.train_batch, ns.train_steps, ns.lr)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return Cost(answer_batched_s=batched, answer_batched_cpu_s=batched_cpu, answer_alone_s=alone, train_step_s=step, train_step_cpu_s=step_cpu,
                train_tokens=tokens, peak_rss_gib=rss)


def demo_ratio(base: ModelResult, other: ModelResult, gen_share: float, train_share: float) -> dict[str, float]:
    """(f): the demo's time relative to the baseline's (see the module docstring)."""
    assert base.cost is not None and other.cost is not None
    tokens = {r.spec: statistics.mean(r.answer_tokens.values()) for r in (base, other)}
    # CPU seconds: on a shared machine the wall clock also counts waiting for a core (one torch thread)
    per_answer = other.cost.answer_batched_cpu_s / base.cost.answer_batched_cpu_s   # at the same length
    length = tokens[other.spec] / tokens[base.spec]
    gen = per_answer * length
    train = other.cost.train_step_cpu_s / base.cost.train_step_cpu_s
    return {"answer_48": per_answer, "answer_length": length, "generation": gen, "train_step": train,
            "demo": gen_share * gen + train_share * train + (1 - gen_share - train_share)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma3-270m,gemma3-270m:plain",
                    help="comma-separated model specs; the first is the baseline; NAME:plain = no chat template")
    ap.add_argument("--task", default="support_desk")
    ap.add_argument("--distractors", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--alone", type=int, default=3, help="prompts timed one at a time (d)")
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=3, help="timed steps after one warm-up step (e)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--gen-share", type=float, default=0.75, help="(f): generation's share of the demo's time")
    ap.add_argument("--train-share", type=float, default=0.15, help="(f): training's share of the demo's time")
    ap.add_argument("--baseline-demo-min", type=float, default=23.1, help="the baseline's measured demo minutes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=2, help="example answers printed per condition")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ns = ap.parse_args(argv)

    import torch

    from shared.models import load_model
    from tools.demo.stats import wilson
    from tools.tasks.task import load_task

    torch.set_num_threads(ns.threads)
    torch.manual_seed(ns.seed)
    task = load_task(ns.task)
    ctx = contexts(task, ns.distractors, ns.seed)
    n_held = len(task.held_out_questions())
    specs = [s.strip() for s in ns.models.split(",") if s.strip()]
    print(f"task {task.name}: {n_held} held-out questions; {os.cpu_count()} CPUs, {ns.threads} torch thread(s)",
          flush=True)
    results: list[ModelResult] = []
    costs_of: dict[str, Cost] = {}
    t_start = time.perf_counter()
    for name in dict.fromkeys(s.partition(":")[0] for s in specs):    # each model loaded once, in order
        t0 = time.perf_counter()
        model, tok = load_model(name)
        load_s = time.perf_counter() - t0
        print(f"{name}: loaded in {load_s:.1f} s ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M "
              f"parameters, vocabulary {len(tok)})", flush=True)
        for spec in (s for s in specs if s.partition(":")[0] == name):
            result = ModelResult(spec)
            accuracy(model, tok, task, ctx, spec.partition(":")[2] == "plain", ns.max_new_tokens, ns.show, result)
            results.append(result)
        costs_of[name] = costs(model, tok, task, ns)    # last: the training steps change the weights
        costs_of[name].load_s = load_s
        del model, tok
        gc.collect()
    results.sort(key=lambda r: specs.index(r.spec))
    for r in results:
        r.cost = costs_of[r.spec.partition(":")[0]]

    print(f"\nheld-out greedy successes / {n_held} by the task's answer check (Wilson 95%), [without the "
          "answers that echo the prompt]; answer tokens = mean generated tokens")
    print(f"{'model':<28}" + "".join(f"{c:>28}" for c in CONDITIONS) + f"{'answer tokens':>15}")
    for r in results:
        cells = ""
        for c in CONDITIONS:
            lo, hi = wilson(r.successes[c], n_held)
            cells += f"{r.successes[c]}/{n_held} ({lo:.0%}-{hi:.0%}) [{r.successes[c] - r.echoes[c]}]".rjust(28)
        print(f"{r.spec:<28}{cells}{statistics.mean(r.answer_tokens.values()):>15.1f}")

    base = results[0]
    print(f"\ncosts ({ns.max_new_tokens} new tokens per answer; training: batch {ns.train_batch}, AdamW fp32; "
          "peak RSS: of the whole process so far)")
    print(f"{'model':<28}{'s/answer batched':>17}{'(CPU s)':>9}{'s/answer alone':>15}{'train step s':>13}{'(CPU s)':>9}"
          f"{'seq tokens':>11}{'peak RSS GiB':>13}{'load s':>8}")
    seen: set[int] = set()
    for r in results:
        cost = r.cost
        if cost is None or id(cost) in seen:
            continue
        seen.add(id(cost))
        print(f"{r.spec:<28}{cost.answer_batched_s:>17.2f}{cost.answer_batched_cpu_s:>9.2f}{cost.answer_alone_s:>15.2f}"
              f"{cost.train_step_s:>13.1f}"
              f"{cost.train_step_cpu_s:>9.1f}{cost.train_tokens:>11.0f}{cost.peak_rss_gib:>13.1f}{cost.load_s:>8.1f}")
    print(f"\nratios to {base.spec}; estimated demo time (f): {ns.gen_share:.0%} generation, "
          f"{ns.train_share:.0%} training, the rest fixed; demo min = ratio x {ns.baseline_demo_min}")
    print(f"{'model':<28}{'answer@48':>10}{'length':>8}{'generation':>11}{'train step':>11}{'demo':>7}"
          f"{'demo min':>9}")
    ratios = {}
    for r in results:
        q = demo_ratio(base, r, ns.gen_share, ns.train_share)
        ratios[r.spec] = q
        print(f"{r.spec:<28}{q['answer_48']:>9.2f}x{q['answer_length']:>7.2f}x{q['generation']:>10.2f}x"
              f"{q['train_step']:>10.2f}x{q['demo']:>6.2f}x{q['demo'] * ns.baseline_demo_min:>9.1f}")

    for r in results:
        print(f"\n{r.spec}:")
        for cond in CONDITIONS:
            for question, text in r.examples[cond]:
                print(f"  [{cond}] {question!r} -> {text[:160]!r}")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    if ns.json:
        ns.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(ns).items()}, "held_out": n_held,
                                       "results": [asdict(r) for r in results], "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
