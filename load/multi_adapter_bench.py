"""One LoRA adapter per tenant: mixed-adapter batches against a single adapter, cold loads,
memory per resident adapter, on the transformers engine with continuous batching.

`--tenants` (100) rank-`--rank` (8) adapters with random weights of the right shapes on every linear layer
of the attention and MLP blocks (the trainer's `all-linear` default) are written in peft's layout and
registered as one version per tenant. Then, in one engine:
1. cold loads: one short request per tenant, each adapter loaded on demand: `--lone` tenants one at a time,
   then the others `--clients` at a time (a burst: loads queue behind each other on the loader thread);
   the cache's own timer (request finds the adapter absent --> resident) gives p50 / p99 of each; the disk
   read + check alone (`load_adapter_weights`) is timed too;
2. throughput: `--requests` requests (tenant drawn uniformly, `--max-new` greedy tokens, `--clients`
   closed-loop clients), each on its tenant's adapter ("mixed"), against the same requests, tenants
   included, all on one adapter ("single"); rounds alternate so machine noise hits both. target >= 0.7x
3. memory: slot memory per resident adapter (exact) and the process's resident-set growth over the run.

Defaults take a few minutes on 2 CPU cores with SmolLM2-135M-Instruct (via shared/models.py).

    .venv/bin/python load/multi_adapter_bench.py
    .venv/bin/python load/multi_adapter_bench.py --model tiny-random --requests 64    # a quick check
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from services.inference.engines import create_engine  # noqa: E402
from services.inference.engines.base import GenerationRequest, VersionFiles  # noqa: E402
from services.inference.multi_lora import load_adapter_weights, save_adapter  # noqa: E402
from services.inference.settings import InferenceSettings  # noqa: E402
from shared.decoding.generation import encode_prompt, render_chat  # noqa: E402
from shared.decoding.params import SamplingConfig  # noqa: E402
from shared.settings import CommonSettings  # noqa: E402

PROMPTS = [f"Customer {i}: my order #{4000 + 17 * i} has not arrived yet. What should I do?" for i in range(12)]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_adapters(model: Any, root: Path, n: int, rank: int) -> list[Path]:
    layers = {name: m for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and name.endswith(TARGETS)}
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(n):
        mods = {name: (torch.randn(rank, m.in_features, generator=g) / m.in_features ** 0.5,
                       torch.randn(m.out_features, rank, generator=g) * 0.01) for name, m in layers.items()}
        out.append(save_adapter(root / f"tenant-{k:03d}", mods, alpha=2.0 * rank))
    return out


def run_requests(eng: Any, jobs: list[tuple[str, str, list[int]]], clients: int, max_new: int) -> tuple[float, int]:
    """Closed-loop clients over `jobs` (tenant, version, prompt ids); (seconds, completion tokens)."""
    lock = threading.Lock()
    queue = list(jobs)
    tokens = [0]
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                tenant, version, ids = queue.pop()
            try:
                h = eng.submit(GenerationRequest(request_id=f"{tenant}-{len(queue)}", prompt_ids=ids, tenant=tenant,
                                                 version=version,
                                                 sampling=SamplingConfig(max_new_tokens=max_new, temperature=0.0)))
                n = sum(len(s.token_ids) for s in h.result(timeout=900))
            except BaseException as e:  # noqa: BLE001 - reported after the run
                errors.append(e)
                return
            with lock:
                tokens[0] += n

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, tokens[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32, help="requests per throughput round and mode")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--lone", type=int, default=10, help="cold loads measured one at a time")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--budget", type=int, default=0, help="adapters resident at once (0 = all tenants)")
    ap.add_argument("--torch-threads", type=int, default=2)
    args = ap.parse_args()

    budget = args.budget or args.tenants
    settings = InferenceSettings(pod_id="bench", batch_wait_ms=5, max_batch_rows=32, tenant_batch_share=1.0,
                                 adapter_cache_max_count=budget, adapter_cache_max_bytes=0,
                                 common=CommonSettings(model=args.model, torch_threads=args.torch_threads))
    t0 = time.perf_counter()
    eng: Any = create_engine("transformers", settings)
    eng.start()
    model = eng._policies["base"].backbone.model
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.1f} s; torch threads {torch.get_num_threads()}")
    root = Path(tempfile.mkdtemp(prefix="multi-adapter-bench-"))
    try:
        t0 = time.perf_counter()
        dirs = write_adapters(model, root, args.tenants, args.rank)
        size = sum(f.stat().st_size for f in dirs[0].iterdir())
        print(f"{args.tenants} rank-{args.rank} adapters written in {time.perf_counter() - t0:.1f} s "
              f"({size / 2**20:.2f} MiB each on disk)")
        tenants = [d.name for d in dirs]
        for d in dirs:
            eng.load_version(VersionFiles(d.name, "lora", d, tenant=d.name))
        pool = eng._policies["base"].backbone.lora
        reads = []
        for d in dirs[:20]:
            t = time.perf_counter()
            load_adapter_weights(d, d.name, pool.linears, dtype=pool.dtype)
            reads.append(time.perf_counter() - t)
        prompt_ids = [encode_prompt(eng.tokenizer, render_chat(eng.tokenizer, [{"role": "user", "content": p}]))
                      for p in PROMPTS]
        rss0 = rss_mib()

        # 1) cold loads: every tenant's first request
        cold = [(t, t, prompt_ids[i % len(prompt_ids)]) for i, t in enumerate(tenants)]
        random.Random(1).shuffle(cold)
        t0 = time.perf_counter()
        run_requests(eng, cold[:args.lone], 1, 2)
        lone = list(eng.adapters.load_seconds)
        run_requests(eng, cold[args.lone:], args.clients, 2)
        dt = time.perf_counter() - t0
        loads = list(eng.adapters.load_seconds)[len(lone):]
        resident = len(eng.adapters.resident())
        per_adapter = eng.adapters.resident_bytes() / max(1, resident)
        rss1 = rss_mib()
        print(f"cold pass: {len(cold)} requests in {dt:.1f} s; {resident} resident, "
              f"{eng.adapters.evictions} evictions")

        # 2) throughput, mixed vs single, alternating rounds
        rng = random.Random(2)
        jobs = [(rng.choice(tenants), rng.randrange(len(prompt_ids))) for _ in range(args.requests)]
        mixed_jobs = [(t, t, prompt_ids[p]) for t, p in jobs]
        single_jobs = [(t, tenants[0], prompt_ids[p]) for t, p in jobs]
        tps: dict[str, list[float]] = {"mixed": [], "single": []}
        for r in range(args.rounds):
            order = [("mixed", mixed_jobs), ("single", single_jobs)]
            for name, js in order if r % 2 == 0 else order[::-1]:
                secs, toks = run_requests(eng, js, args.clients, args.max_new)
                tps[name].append(toks / secs)
                print(f"round {r} {name:<6}: {toks} tokens in {secs:.1f} s = {toks / secs:.1f} tok/s")
        mixed, single = sum(tps["mixed"]) / len(tps["mixed"]), sum(tps["single"]) / len(tps["single"])
        ratio = mixed / single

        print()
        print("| measure | value | target |")
        print("| --- | --- | --- |")
        print(f"| throughput, {args.tenants} tenants' adapters mixed | {mixed:.1f} tok/s | |")
        print(f"| throughput, same requests on one adapter | {single:.1f} tok/s | |")
        print(f"| ratio mixed / single | {ratio:.2f}x | >= 0.7x {'ok' if ratio >= 0.7 else 'MISS'} |")
        print(f"| cold load alone p50 / p99 (request -> resident, {len(lone)} loads) | {pct(lone, 0.5) * 1000:.0f} ms"
              f" / {pct(lone, 0.99) * 1000:.0f} ms | p50 < 1 s {'ok' if pct(lone, 0.5) < 1 else 'MISS'} |")
        print(f"| cold load in a burst of {args.clients}, p50 / p99 ({len(loads)} loads) | {pct(loads, 0.5) * 1000:.0f} ms"
              f" / {pct(loads, 0.99) * 1000:.0f} ms | |")
        print(f"| disk read + check of one adapter, p50 / p99 | {pct(reads, 0.5) * 1000:.0f} ms / "
              f"{pct(reads, 0.99) * 1000:.0f} ms | |")
        print(f"| memory per resident adapter (slot) | {per_adapter / 2**20:.2f} MiB | |")
        print(f"| process RSS growth, {resident} adapters resident | {rss1 - rss0:.0f} MiB "
              f"({(rss1 - rss0) / max(1, resident):.2f} MiB each) | |")
    finally:
        eng.shutdown(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
