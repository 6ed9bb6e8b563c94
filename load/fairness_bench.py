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
3. http-tenants (issue #33): p50 latency of tenant B's short completions over the OpenAI-compatible HTTP
   door while tenant A keeps `--http-clients` (80) requests of n=`--http-n` (4) x `--http-tokens` (2000)
   in flight (each 429 waits its Retry-After), against B idle, for three servers one after another:
   no quotas with one shared pool of HTTP workers (as before the issue), quotas with the shared pool, and
   the defaults (quotas, each tenant `http_tenant_share` of the workers).  target <= 3x for the defaults
   Only with `--only http-tenants`.

Each scheduler runs as its own server process (`python -m services.inference`), as deployed, so its
threads do not share an interpreter lock with the clients. Defaults fit a few minutes on 2 cores with
the tiny model; `--model smollm2-135m-instruct` with smaller `--long-tokens` for the real one.

    .venv/bin/python load/fairness_bench.py
    .venv/bin/python load/fairness_bench.py --only throughput --clients 16
    .venv/bin/python load/fairness_bench.py --only http-tenants
"""

from __future__ import annotations

import argparse
import http.client
import json
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One inference server process with the given scheduler (gRPC and the OpenAI-compatible HTTP door)."""

    def __init__(self, model: str, bootstrap: str, prefix: str, scheduler: str, torch_threads: int,
                 extra_env: dict[str, str] | None = None) -> None:
        self.port, self.http_port = _free_port(), _free_port()
        self.home = Path(tempfile.mkdtemp(prefix=f"fair-{scheduler}-"))
        env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
                   APPRENTICE_TOPIC_PREFIX=prefix, APPRENTICE_HOME=str(self.home),
                   APPRENTICE_INFERENCE_PORT=str(self.port), APPRENTICE_INFERENCE_HOST="127.0.0.1",
                   APPRENTICE_INFERENCE_METRICS_PORT="0", APPRENTICE_INFERENCE_HTTP_PORT=str(self.http_port),
                   APPRENTICE_INFERENCE_FOLLOW_UPDATES="false", APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0",
                   APPRENTICE_INFERENCE_POD_ID=f"fair-{scheduler}-{uuid.uuid4().hex[:6]}",
                   APPRENTICE_INFERENCE_SCHEDULER=scheduler, APPRENTICE_TORCH_THREADS=str(torch_threads),
                   APPRENTICE_LOG_LEVEL="WARNING", **(extra_env or {}))
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


# --- 3. one tenant's HTTP flood against another's latency (issue #33) --------------------------------
HTTP_CONFIGS = {
    # name: server environment (defaults = quotas on, each tenant a share of the HTTP workers)
    "no-quotas-shared-workers": {"APPRENTICE_INFERENCE_QUOTA__MAX_CONCURRENT": "0",
                                  "APPRENTICE_INFERENCE_QUOTA__TOKENS_PER_S": "0",
                                  "APPRENTICE_INFERENCE_HTTP_TENANT_SHARE": "1.0"},
    "quotas-shared-workers": {"APPRENTICE_INFERENCE_HTTP_TENANT_SHARE": "1.0"},
    "defaults": {},
}


def http_completion(port: int, tenant: str, body: dict[str, Any], timeout: float,
                    conns: list[http.client.HTTPConnection] | None = None) -> tuple[int, float]:
    """POST /v1/completions as `tenant` (a server without keys: the tenant header names it); returns the
    status and the Retry-After seconds of a 429 (0 otherwise)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if conns is not None:
        conns.append(conn)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json", "x-apprentice-tenant": tenant})
        r = conn.getresponse()
        r.read()
        return r.status, float(r.headers.get("Retry-After") or 0)
    finally:
        conn.close()


def http_b_latencies(port: int, n: int) -> tuple[list[float], int]:
    """Tenant B: n short completions one after another; latency of each (a failure counts as the deadline)."""
    out, failed = [], 0
    for i in range(n):
        t0 = time.perf_counter()
        try:
            status, _ = http_completion(port, "tenant-b", {"prompt": SHORT_PROMPTS[i % len(SHORT_PROMPTS)],
                                                           "max_tokens": 2 + i % 7, "temperature": 0}, 60)
        except OSError:
            status = 0
        if status != 200:
            failed += 1
            out.append(60.0)
            continue
        out.append(time.perf_counter() - t0)
    return out, failed


class HttpFlood:
    """Tenant A: `clients` requests (n=`n`, `tokens` max_tokens) always in flight over HTTP; a 429 waits its
    Retry-After, as a well-behaved client does, then sends again. Stopping closes every open socket, which
    cancels A's running generations (the server watches for disconnects)."""

    def __init__(self, port: int, clients: int, n: int, tokens: int, settle_s: float = 3.0) -> None:
        self.port, self.n, self.tokens, self.settle_s = port, n, tokens, settle_s
        self.stop = threading.Event()
        self.counts = {"ok": 0, "429": 0, "other": 0}
        self.conns: list[http.client.HTTPConnection] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> HttpFlood:
        for t in self.threads:
            t.start()
        time.sleep(self.settle_s)
        return self

    def _run(self) -> None:
        body = {"prompt": LONG_PROMPT, "n": self.n, "max_tokens": self.tokens, "temperature": 1.0}
        while not self.stop.is_set():
            try:
                status, retry = http_completion(self.port, "tenant-a", body, 600, self.conns)
            except OSError:
                status, retry = -1, 0.0
            key = "ok" if status == 200 else "429" if status == 429 else "other"
            self.counts[key] += 1
            if status != 200:
                self.stop.wait(retry or 0.5)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for conn in list(self.conns):
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(120)


def http_tenants(port: int, n: int, clients: int, a_n: int, a_tokens: int) -> dict[str, Any]:
    http_b_latencies(port, 4)                                   # warm-up
    idle, _ = http_b_latencies(port, n - n // 2)
    with HttpFlood(port, clients, a_n, a_tokens) as flood:
        loaded, failed = http_b_latencies(port, n)
        counts = dict(flood.counts)
    idle2, _ = http_b_latencies(port, n // 2)
    idle += idle2
    return {"idle_p50": pct(idle, 0.5), "load_p50": pct(loaded, 0.5), "load_p99": pct(loaded, 0.99),
            "b_failed": failed, "a_answers": counts}


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
    ap.add_argument("--only", choices=("short-under-load", "throughput", "http-tenants"))
    ap.add_argument("--http-clients", type=int, default=80, help="http-tenants: tenant A's concurrent requests")
    ap.add_argument("--http-n", type=int, default=4, help="http-tenants: n of each of A's requests")
    ap.add_argument("--http-tokens", type=int, default=2000, help="http-tenants: max_tokens of A's requests")
    ap.add_argument("--http-configs", default=",".join(HTTP_CONFIGS),
                    help="http-tenants: which server configurations, comma-separated")
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
    if ns.only == "http-tenants":
        return http_main(ns, topics)
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


def http_main(ns: argparse.Namespace, topics: Topics) -> int:
    """Tenant B's p50 over HTTP, idle and while A floods, for each server configuration (one at a time)."""
    results: list[tuple[str, str, str, float | None, str, bool | None]] = []
    t_start = time.perf_counter()
    try:
        for name in [c.strip() for c in ns.http_configs.split(",") if c.strip()]:
            server = Server(ns.model, ns.bootstrap, topics.prefix, "continuous", ns.torch_threads,
                            HTTP_CONFIGS[name])
            try:
                with server.client("warm") as c:
                    c.wait_ready(600)
                r = http_tenants(server.http_port, ns.short_requests, ns.http_clients, ns.http_n, ns.http_tokens)
            finally:
                server.stop()
            print(f"http-tenants ({name}): {r}", flush=True)
            ratio = r["load_p50"] / r["idle_p50"]
            last = name == list(HTTP_CONFIGS)[-1]
            results.append((f"B p50 over HTTP: {name}", f"idle {r['idle_p50'] * 1000:.0f} ms",
                            f"A flooding {r['load_p50'] * 1000:.0f} ms, {r['b_failed']} failed", ratio,
                            "<= 3" if last else "ref", (ratio <= 3 and r["b_failed"] == 0) if last else None))
    finally:
        delete_topics(ns.bootstrap, [s.name for s in topics.specs()])
    print(f"\nmodel={ns.model} A={ns.http_clients} concurrent HTTP requests n={ns.http_n} "
          f"max_tokens={ns.http_tokens}, B short 2-8 tokens torch_threads={ns.torch_threads} "
          f"cpus={os.cpu_count()} wall={time.perf_counter() - t_start:.0f}s")
    header()
    for row_ in results:
        row(*row_)
    return 0 if all(r[5] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
