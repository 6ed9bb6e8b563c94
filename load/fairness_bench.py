"""Fair-scheduling benchmarks, each a ratio against a baseline measured in the same run.

1. short-under-load: p99 latency of short requests (2-8 new tokens, greedy, 10 s deadline) from tenant B,
   one after another, while tenant A keeps two requests of n=16 x `--long-tokens` in flight, against the
   same short requests on the idle engine (half measured before the load, half after). target <= 3x
   The same scenario on the static scheduler is reported for reference (its symptom: timeouts).
2. throughput: completion tokens/s of `--clients` closed-loop clients of one tenant sending requests of
   mixed lengths (`--min-new`..`--max-new` tokens, seeded sampling, identical request lists), continuous
   batching against the static scheduler (`APPRENTICE_INFERENCE_SCHEDULER=static`); rounds alternate
   between the two servers so machine noise hits both. Twice: prompts cycling through 8 (the continuous
   engine's prompt cache holds them; static batching shares a prefill between equal prompts of one
   batch), and every prompt its own (neither can reuse a prefill).                      target >= 1.0x

Each scheduler runs as its own server process (`python -m services.inference`), as deployed, so its
threads do not share an interpreter lock with the clients. Defaults fit a few minutes on 2 cores with
the tiny model; `--model smollm2-135m-instruct` with smaller `--long-tokens` for the real one.

    .venv/bin/python load/fairness_bench.py
    .venv/bin/python load/fairness_bench.py --only throughput --clients 16
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.inference.client import InferenceClient  # noqa: E402
from shared.contracts.topic_access import ADMIN  # noqa: E402
from shared.contracts.topics import Topics  # noqa: E402
from shared.kafka.admin import delete_topics, ensure_topics  # noqa: E402
from shared.settings import default_home  # noqa: E402
from tools.broker.local_broker import apply_client_env  # noqa: E402

SHORT_PROMPTS = [f"Quick question {i}: is order #{2000 + i} shipped?" for i in range(8)]
LONG_PROMPT = "Write a long, detailed story about a lighthouse keeper and the sea."
DEADLINE_S = 10.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def row(name: str, base: str, value: str, ratio: float | None, target: str, ok: bool | None) -> None:
    r = f"{ratio:6.2f}x" if ratio is not None else f"{'-':>7}"
    mark = "" if ok is None else ("ok" if ok else "MISS")
    print(f"| {name:<30} | {base:<26} | {value:<34} | {r} | {target:<8} | {mark:<4} |")


def header() -> None:
    print(f"| {'benchmark':<30} | {'baseline':<26} | {'measured':<34} | {'ratio':>7} | {'target':<8} | {'':<4} |")
    print(f"|{'-' * 32}|{'-' * 28}|{'-' * 36}|{'-' * 9}|{'-' * 10}|{'-' * 6}|")


class Server:
    """One inference server process with the given scheduler."""

    def __init__(self, model: str, bootstrap: str, prefix: str, scheduler: str, torch_threads: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.home = Path(tempfile.mkdtemp(prefix=f"fair-{scheduler}-"))
        env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
                   APPRENTICE_TOPIC_PREFIX=prefix, APPRENTICE_HOME=str(self.home),
                   APPRENTICE_INFERENCE_PORT=str(self.port), APPRENTICE_INFERENCE_HOST="127.0.0.1",
                   APPRENTICE_INFERENCE_METRICS_PORT="0", APPRENTICE_INFERENCE_HTTP_PORT="0",
                   APPRENTICE_INFERENCE_FOLLOW_UPDATES="false", APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0",
                   APPRENTICE_INFERENCE_POD_ID=f"fair-{scheduler}-{uuid.uuid4().hex[:6]}",
                   APPRENTICE_INFERENCE_SCHEDULER=scheduler, APPRENTICE_TORCH_THREADS=str(torch_threads),
                   APPRENTICE_LOG_LEVEL="WARNING")
        self.proc = subprocess.Popen([sys.executable, "-m", "services.inference"], env=env,
                                     cwd=Path(__file__).resolve().parents[1])
        self.target = f"127.0.0.1:{self.port}"

    def client(self, tenant: str) -> InferenceClient:
        return InferenceClient(self.target, tenant=tenant)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.home, ignore_errors=True)


# --- 1. short requests under load ---------------------------------------------------------------------
def short_latencies(c: InferenceClient, n: int) -> tuple[list[float], int]:
    """Latencies of n short greedy requests, one after another; a timed-out call counts as its deadline."""
    out, timeouts = [], 0
    for i in range(n):
        t0 = time.perf_counter()
        try:
            r = c.generate(SHORT_PROMPTS[i % len(SHORT_PROMPTS)], max_new_tokens=2 + i % 7, timeout=DEADLINE_S)
            assert r.choices[0].token_count > 0
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            timeouts += 1
        out.append(time.perf_counter() - t0)
    return out, timeouts


class LongLoad:
    """Tenant A: `streams` unary requests of n=16 x `tokens` always in flight (each resubmitted when it ends),
    the load that starved short requests on the static scheduler (two such requests from one client)."""

    def __init__(self, server: Server, tokens: int, streams: int = 2, settle_s: float = 2.0) -> None:
        self.server, self.tokens, self.settle_s = server, tokens, settle_s
        self.stop = threading.Event()
        self.completed = 0
        self.calls: list[Any] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(streams)]

    def __enter__(self) -> LongLoad:
        for t in self.threads:
            t.start()
        time.sleep(self.settle_s)                 # both long requests admitted and decoding (prefill done)
        return self

    def _run(self) -> None:
        with self.server.client("tenant-a") as c:
            while not self.stop.is_set():
                call = c._inference.Generate.future(
                    c.request(LONG_PROMPT, n=16, max_new_tokens=self.tokens, temperature=1.0),
                    metadata=c._metadata)
                self.calls.append(call)
                try:
                    call.result()
                    self.completed += 1
                except grpc.FutureCancelledError:
                    return
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED:
                        raise

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for call in self.calls:
            call.cancel()
        for t in self.threads:
            t.join(120)


def short_under_load(server: Server, n: int, long_tokens: int) -> dict[str, Any]:
    with server.client("tenant-b") as b:
        short_latencies(b, 4)                                 # warm-up
        idle, idle_to = short_latencies(b, n - n // 2)        # idle before and after the load: drift of
        with LongLoad(server, long_tokens) as load:           # a shared machine hits both sides
            t0 = time.perf_counter()
            loaded, loaded_to = short_latencies(b, n)
            span = time.perf_counter() - t0
            long_done = load.completed
        idle2, idle2_to = short_latencies(b, n // 2)
        idle, idle_to = idle + idle2, idle_to + idle2_to
    return {"idle_p99": pct(idle, 0.99), "idle_p50": pct(idle, 0.5), "idle_timeouts": idle_to,
            "load_p99": pct(loaded, 0.99), "load_p50": pct(loaded, 0.5), "load_timeouts": loaded_to,
            "span_s": span, "long_completed_during": long_done, "long_tokens": long_tokens}


# --- 2. throughput ----------------------------------------------------------------------------------
def workload(clients: int, per_client: int, lo: int, hi: int, unique: str = "") -> list[list[dict[str, Any]]]:
    """Each client's request list. Prompts cycle through `SHORT_PROMPTS` (repeated prompts, as traffic
    has them), or with `unique` set every request's prompt is its own (tagged with `unique`, so no two
    rounds share one either): the continuous engine's prompt cache cannot help there."""
    rng = random.Random(15)

    def prompt(w: int, k: int) -> str:
        if unique:
            return f"Quick question {unique}.{w}.{k}: is order #{2000 + 37 * w + k} shipped?"
        return SHORT_PROMPTS[(w + k) % len(SHORT_PROMPTS)]

    return [[{"prompt": prompt(w, k), "max_new_tokens": rng.randint(lo, hi),
              "temperature": 0.8, "seed": 1 + w * 1000 + k} for k in range(per_client)] for w in range(clients)]


def throughput_round(server: Server, work: list[list[dict[str, Any]]]) -> tuple[int, float]:
    """Completion tokens and wall seconds for every client's list, clients running concurrently."""
    tokens = [0] * len(work)

    def worker(w: int) -> None:
        with server.client("tenant-t") as c:
            for req in work[w]:
                r = c.generate(req["prompt"], max_new_tokens=req["max_new_tokens"],
                               temperature=req["temperature"], seed=req["seed"], timeout=600)
                tokens[w] += r.usage.completion_tokens

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(len(work))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    # against the local broker (SASL only, authorizing): this benchmark sets up its own topics, so it runs
    # as that broker's admin unless the environment sets Kafka credentials (docs/deployment.md)
    apply_client_env(default_home(), ADMIN)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--only", choices=("short-under-load", "throughput"))
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--short-requests", type=int, default=40, help="short requests per side (idle, loaded)")
    ap.add_argument("--long-tokens", type=int, default=1000, help="max_new_tokens of tenant A's n=16 requests")
    ap.add_argument("--static-short-requests", type=int, default=6,
                    help="short requests under load on the static scheduler (reference row; 0 = skip)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--per-client", type=int, default=4, help="throughput: requests per client per round")
    ap.add_argument("--rounds", type=int, default=2, help="throughput: rounds per scheduler (alternating)")
    ap.add_argument("--prompts", choices=("repeated", "unique", "both"), default="both",
                    help="throughput: prompts cycling through 8 (as traffic repeats them), each its own, or both")
    ap.add_argument("--min-new", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="intra-op threads of each server (1: on a small shared machine two threads wait on "
                         "each other at every op)")
    ns = ap.parse_args(argv)

    topics = Topics(prefix=f"bench-fair-{uuid.uuid4().hex[:6]}.")
    ensure_topics(ns.bootstrap, topics)
    cont = Server(ns.model, ns.bootstrap, topics.prefix, "continuous", ns.torch_threads)
    static = Server(ns.model, ns.bootstrap, topics.prefix, "static", ns.torch_threads)
    results: list[tuple[str, str, str, float | None, str, bool | None]] = []
    t_start = time.perf_counter()
    try:
        for s in (cont, static):
            with s.client("warm") as c:
                c.wait_ready(600)
        if ns.only in (None, "short-under-load"):
            a = short_under_load(cont, ns.short_requests, ns.long_tokens)
            ratio = a["load_p99"] / a["idle_p99"]
            results.append(("short p99 under long load", f"idle {a['idle_p99'] * 1000:.0f} ms",
                            f"A running {a['load_p99'] * 1000:.0f} ms, {a['load_timeouts']} timeouts", ratio,
                            "<= 3", ratio <= 3 and a["load_timeouts"] == 0))
            results.append(("short p50 under long load", f"idle {a['idle_p50'] * 1000:.0f} ms",
                            f"A running {a['load_p50'] * 1000:.0f} ms", a["load_p50"] / a["idle_p50"], "", None))
            print(f"short-under-load (continuous): {a}", flush=True)
            if ns.static_short_requests > 0:
                st = short_under_load(static, ns.static_short_requests, ns.long_tokens)
                results.append(("same on the static scheduler", f"idle {st['idle_p99'] * 1000:.0f} ms",
                                f"A running {st['load_p99'] * 1000:.0f} ms, {st['load_timeouts']}/"
                                f"{ns.static_short_requests} timeouts", st["load_p99"] / st["idle_p99"], "ref",
                                None))
                print(f"short-under-load (static): {st}", flush=True)
        if ns.only in (None, "throughput"):
            throughput_round(cont, [w[:1] for w in workload(ns.clients, 1, ns.min_new, ns.max_new, "warm")])
            throughput_round(static, [w[:1] for w in workload(ns.clients, 1, ns.min_new, ns.max_new, "warm")])
            for kind in ("repeated", "unique") if ns.prompts == "both" else (ns.prompts,):
                tot = {"continuous": [0, 0.0], "static": [0, 0.0]}
                for k in range(ns.rounds):
                    work = workload(ns.clients, ns.per_client, ns.min_new, ns.max_new,
                                    f"r{k}" if kind == "unique" else "")
                    order = [("continuous", cont), ("static", static)]
                    for name, server in (order if k % 2 == 0 else order[::-1]):
                        tokens, secs = throughput_round(server, work)
                        tot[name][0] += tokens
                        tot[name][1] += secs
                        print(f"throughput ({kind} prompts) round {k} {name}: {tokens} tokens in {secs:.1f} s",
                              flush=True)
                c_tps = tot["continuous"][0] / tot["continuous"][1]
                s_tps = tot["static"][0] / tot["static"][1]
                results.append((f"throughput, {kind} prompts", f"static {s_tps:.0f} tok/s",
                                f"continuous {c_tps:.0f} tok/s", c_tps / s_tps, ">= 1.0", c_tps / s_tps >= 1.0))
    finally:
        cont.stop()
        static.stop()
        delete_topics(ns.bootstrap, [s.name for s in topics.specs()])

    print(f"\nmodel={ns.model} long=n16x{ns.long_tokens} short=2-8 tokens clients={ns.clients} "
          f"new tokens {ns.min_new}-{ns.max_new} torch_threads={ns.torch_threads} cpus={os.cpu_count()} "
          f"wall={time.perf_counter() - t_start:.0f}s")
    header()
    for r in results:
        row(*r)
    return 0 if all(r[5] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
