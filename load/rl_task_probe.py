"""Can GRPO learn a task at all? Measures the base policy's KPI success on a task's held-out messages
with the demo's sampling, and how often a group of samples has mixed rewards (GRPO's advantage is zero in
a group whose rewards are all equal, so only mixed groups teach anything).

The sampling is the demo's deployment sampling (tools/demo/demo.py, simulated_users.py): the task's
chat messages, temperature 0.7, top-p 0.95, `--max-new-tokens` (the full demo budget: 48), through the
same `shared.decoding.generation.generate` the inference engine uses; the KPI is the task's own check
(`tools.tasks.task.check_answer`), the rule the simulated backend reports.

    python load/rl_task_probe.py --task support_routing --n 8

Prints the greedy and sampled success with Wilson 95% intervals, the share of mixed groups of n, per-fact
rates, how often a task's tool is called (the reward-hack variant) and a few replies.
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
    ap.add_argument("--task", default="support_routing")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--split", choices=("held_out", "train"), default="held_out")
    ap.add_argument("--n", type=int, default=8, help="samples per message (the GRPO group size)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("APPRENTICE_TORCH_THREADS", "1")))
    ap.add_argument("--show", type=int, default=6, help="replies to print")
    ns = ap.parse_args(argv)

    import torch

    from shared.decoding.generation import generate, render_chat
    from shared.decoding.params import SamplingConfig
    from shared.models import load_model
    from tools.demo.stats import wilson
    from tools.tasks.task import check_answer, load_task

    torch.set_num_threads(ns.threads)
    task = load_task(ns.task)
    items = task.held_out_questions() if ns.split == "held_out" else task.train_questions()
    model, tok = load_model(ns.model)
    model.eval()
    prompts = [render_chat(tok, task.messages(q)) for _, q in items]
    t0 = time.time()
    with torch.no_grad():
        greedy = generate(model, tok, prompts, max_new_tokens=ns.max_new_tokens)
        sampled = generate(model, tok, prompts, [SamplingConfig(max_new_tokens=ns.max_new_tokens,
                                                                temperature=ns.temperature, top_p=ns.top_p,
                                                                n=ns.n, seed=ns.seed + i)
                                                 for i in range(len(prompts))])
    seconds = time.time() - t0
    g_ok = [check_answer(f, g[0].text).value >= 1 for (f, _), g in zip(items, greedy, strict=True)]
    s_ok = [[check_answer(f, s.text).value >= 1 for s in group] for (f, _), group in zip(items, sampled, strict=True)]
    flat = [x for group in s_ok for x in group]
    mixed = sum(0 < sum(group) < len(group) for group in s_ok)

    def rate(k: int, n: int) -> str:
        lo, hi = wilson(k, n)
        return f"{k}/{n} = {k / max(n, 1):.0%} (95% CI {lo:.0%}-{hi:.0%})"

    print(f"task {task.name}, {ns.split} messages: {len(items)}, model {ns.model}, T={ns.temperature}, "
          f"top_p={ns.top_p}, max_new_tokens={ns.max_new_tokens}, n={ns.n}, {seconds:.0f} s")
    print(f"greedy success:  {rate(sum(g_ok), len(g_ok))}")
    print(f"sampled success: {rate(sum(flat), len(flat))}")
    print(f"mixed groups (GRPO signal): {rate(mixed, len(s_ok))}; all-fail {sum(not any(g) for g in s_ok)}, "
          f"all-pass {sum(all(g) for g in s_ok)}")
    if task.tool is not None:
        # how often the base policy asks for the backend's lookup: the loophole of the reward-hack variant
        # pays only if the policy ever produces the call
        calls = sum(task.tool.called(s.text) for group in sampled for s in group)
        g_calls = sum(task.tool.called(g[0].text) for g in greedy)
        print(f"tool {task.tool.name} called: greedy {rate(g_calls, len(greedy))}, sampled {rate(calls, len(flat))}")
    by_fact: dict[str, list[bool]] = {}
    for (f, _), oks in zip(items, s_ok, strict=True):
        by_fact.setdefault(f.id, []).extend(oks)
    print("per fact (sampled): " + ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in by_fact.items()))
    for (f, q), group, ok in list(zip(items, sampled, s_ok, strict=True))[: ns.show]:
        print(f"  [{f.id}] {q!r}")
        for s, k in list(zip(group, ok, strict=True))[:3]:
            print(f"      {'PASS' if k else 'fail'} {s.text.strip()[:100]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
