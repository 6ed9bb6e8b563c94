"""OpenAI-compatible HTTP vs gRPC: latency of the same requests on the same engine.

One inference server (a subprocess, so it shares no interpreter lock with the clients) serves both doors;
the same chat request (greedy, so both doors generate the same tokens) goes through gRPC `Generate`
(the Python stub, whose C core releases the interpreter lock) and through `POST /v1/chat/completions`
(a keep-alive `http.client` connection per client thread, the leanest Python HTTP client, and the
official openai SDK for reference: its httpx + pydantic work shows at 8 client threads), at each
concurrency, in alternating blocks so machine noise hits every door alike. Besides the clients'
latency, the server's own mean per door (its request histogram, from handler start to answer) is
reported. Capture is on for both (a fresh topic namespace on the broker).

    .venv/bin/python load/openai_vs_grpc_bench.py                      # tiny model, concurrency 1 and 8
    .venv/bin/python load/openai_vs_grpc_bench.py --requests 400 --max-tokens 32 --json out.json

Prints p50/p99 per door and the ratio HTTP/gRPC; target: HTTP p50 <= 1.10x gRPC at every concurrency.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import openai  # noqa: E402

from services.inference.client import InferenceClient  # noqa: E402
from shared.contracts.topic_access import ADMIN  # noqa: E402
from shared.contracts.topics import Topics  # noqa: E402
from shared.kafka.admin import delete_topics, ensure_topics  # noqa: E402
from shared.settings import default_home  # noqa: E402
from tests.helpers.ports import free_port  # noqa: E402
from tools.broker.local_broker import apply_client_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "My order #1042 has not arrived. What should I do?"}]
TARGET = 1.10


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def spawn(model: str, bootstrap: str, prefix: str, tmp: Path,
          torch_threads: int) -> tuple[subprocess.Popen[bytes], int, int, int]:
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
               APPRENTICE_TOPIC_PREFIX=prefix, APPRENTICE_HOME=str(tmp), APPRENTICE_INFERENCE_PORT=str(grpc_port),
               APPRENTICE_INFERENCE_HTTP_PORT=str(http_port), APPRENTICE_INFERENCE_HOST="127.0.0.1",
               APPRENTICE_INFERENCE_METRICS_PORT=str(metrics_port), APPRENTICE_INFERENCE_FOLLOW_UPDATES="false",
               APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0", APPRENTICE_INFERENCE_POD_ID=f"bench-{uuid.uuid4().hex[:6]}",
               APPRENTICE_LOG_LEVEL="WARNING", APPRENTICE_TORCH_THREADS=str(torch_threads))
    for name in ("APPRENTICE_AUTH_KEYS", "APPRENTICE_AUTH_KEYS_FILE", "APPRENTICE_TLS_CERT", "APPRENTICE_TLS_KEY"):
        env.pop(name, None)           # plaintext, no keys: both doors on loopback alike
    proc = subprocess.Popen([sys.executable, "-m", "services.inference"], env=env, cwd=REPO)
    return proc, grpc_port, http_port, metrics_port


SERVER_METHOD = {"grpc": "Generate", "http": "http.chat.completions", "http (openai SDK)": "http.chat.completions"}


def server_totals(metrics_port: int) -> dict[str, tuple[float, float]]:
    """(seconds, calls) so far per server method, from the server's request-latency histogram."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    out = {}
    for method in set(SERVER_METHOD.values()):
        total = re.search(rf'apprentice_inference_request_seconds_sum{{method="{re.escape(method)}"}} (\S+)', text)
        count = re.search(rf'apprentice_inference_request_seconds_count{{method="{re.escape(method)}"}} (\S+)', text)
        out[method] = (float(total.group(1)), float(count.group(1))) if total and count else (0.0, 0.0)
    return out


class Doors:
    """One call per door, each returning the number of completion tokens (checked equal across doors)."""

    def __init__(self, model: str, grpc_port: int, http_port: int, max_tokens: int) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.grpc = InferenceClient(f"127.0.0.1:{grpc_port}")
        self.http_port = http_port
        self._conn = threading.local()
        self.sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="bench", max_retries=0)
        self.body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
        self.raw_body = json.dumps(self.body).encode()

    def call_grpc(self) -> int:
        return int(self.grpc.generate(MESSAGES, max_new_tokens=self.max_tokens).usage.completion_tokens)

    def call_http(self) -> int:
        conn = getattr(self._conn, "c", None)
        if conn is None:
            conn = self._conn.c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=120)
        conn.request("POST", "/v1/chat/completions", self.raw_body, {"content-type": "application/json"})
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, body[:300]
        return int(json.loads(body)["usage"]["completion_tokens"])

    def call_sdk(self) -> int:
        r = self.sdk.chat.completions.create(model=self.model, messages=MESSAGES,  # type: ignore[arg-type]
                                             max_tokens=self.max_tokens, temperature=0)
        assert r.usage is not None
        return int(r.usage.completion_tokens)

    def close(self) -> None:
        self.grpc.close()
        self.sdk.close()


def block(call: Callable[[], int], concurrency: int, per_client: int, out: list[float], tokens: set[int]) -> None:
    """`concurrency` clients, each making `per_client` calls back to back; latencies appended to `out`."""
    lock = threading.Lock()

    def client() -> None:
        for _ in range(per_client):
            t0 = time.perf_counter()
            n = call()
            dt = time.perf_counter() - t0
            with lock:
                out.append(dt)
                tokens.add(n)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure(doors: Doors, concurrency: int, requests: int, per_block: int, with_sdk: bool,
            metrics_port: int) -> dict[str, Any]:
    calls: dict[str, Callable[[], int]] = {"grpc": doors.call_grpc, "http": doors.call_http}
    if with_sdk:
        calls["http (openai SDK)"] = doors.call_sdk
    lat: dict[str, list[float]] = {k: [] for k in calls}
    server: dict[str, list[float]] = {k: [0.0, 0.0] for k in calls}
    tokens: dict[str, set[int]] = {k: set() for k in calls}
    for call in calls.values():                       # warm-up: connections, first batches
        block(call, concurrency, 2, [], set())
    per_client = max(1, per_block // concurrency)
    blocks = max(1, requests // (per_client * concurrency))
    order = list(calls)
    for b in range(blocks):
        for name in order if b % 2 == 0 else order[::-1]:
            before = server_totals(metrics_port)[SERVER_METHOD[name]]
            block(calls[name], concurrency, per_client, lat[name], tokens[name])
            after = server_totals(metrics_port)[SERVER_METHOD[name]]
            server[name][0] += after[0] - before[0]
            server[name][1] += after[1] - before[1]
    assert len(set().union(*tokens.values())) == 1, f"the doors generated different lengths: {tokens}"
    return {name: {"n": len(xs), "p50_ms": 1000 * pct(xs, 0.5), "p99_ms": 1000 * pct(xs, 0.99),
                   "mean_ms": 1000 * sum(xs) / len(xs),
                   "server_mean_ms": 1000 * server[name][0] / max(1.0, server[name][1])}
            for name, xs in lat.items()}


def main(argv: list[str] | None = None) -> int:
    # against the local broker (SASL only, authorizing): this benchmark sets up its own topics, so it runs
    # as that broker's admin unless the environment sets Kafka credentials (docs/deployment.md)
    apply_client_env(default_home(), ADMIN)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--bootstrap", default=os.environ.get("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--concurrency", default="1,8", help="comma-separated client counts")
    ap.add_argument("--requests", type=int, default=200, help="requests per door and concurrency")
    ap.add_argument("--per-block", type=int, default=16, help="requests per door before switching doors")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--no-sdk", action="store_true", help="skip the openai SDK column")
    ap.add_argument("--torch-threads", type=int, default=1, help="the server's intra-op threads")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ns = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="openai-bench-"))
    topics = Topics(prefix=f"bench-oai-{uuid.uuid4().hex[:6]}.")
    ensure_topics(ns.bootstrap, topics)
    proc, grpc_port, http_port, metrics_port = spawn(ns.model, ns.bootstrap, topics.prefix, tmp, ns.torch_threads)
    results: dict[str, Any] = {"model": ns.model, "max_tokens": ns.max_tokens, "date": time.strftime("%Y-%m-%d"),
                               "machine": f"{os.cpu_count()} CPUs, {os.uname().machine}", "runs": {}}
    ok = True
    try:
        with InferenceClient(f"127.0.0.1:{grpc_port}") as c:
            c.wait_ready(300)
        print(f"model {ns.model}, max_tokens {ns.max_tokens}, greedy, capture on; {results['machine']}\n")
        print(f"| {'concurrency':>11} | {'door':<18} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | "
              f"{'p50 ratio':>9} | {'p99 ratio':>9} | {'server mean ms':>14} |")
        print(f"|{'-' * 13}|{'-' * 20}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 11}|{'-' * 16}|")
        for conc in (int(x) for x in ns.concurrency.split(",")):
            doors = Doors(ns.model, grpc_port, http_port, ns.max_tokens)
            try:
                run = measure(doors, conc, ns.requests, ns.per_block, not ns.no_sdk, metrics_port)
            finally:
                doors.close()
            base = run["grpc"]
            for name, r in run.items():
                r["p50_ratio"], r["p99_ratio"] = r["p50_ms"] / base["p50_ms"], r["p99_ms"] / base["p99_ms"]
                print(f"| {conc:>11} | {name:<18} | {r['n']:>4} | {r['p50_ms']:>8.1f} | {r['p99_ms']:>8.1f} | "
                      f"{r['p50_ratio']:>8.2f}x | {r['p99_ratio']:>8.2f}x | {r['server_mean_ms']:>14.1f} |")
            ok &= run["http"]["p50_ratio"] <= TARGET
            results["runs"][str(conc)] = run
        print(f"\nHTTP p50 <= {TARGET:.2f}x gRPC at every concurrency: {'ok' if ok else 'MISS'}")
        if ns.json:
            ns.json.write_text(json.dumps(results, indent=2))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        delete_topics(ns.bootstrap, [s.name for s in topics.specs()])
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
