"""Inference benchmarks, each a ratio against a baseline measured in the same run.

1. gateway: latency p50/p95 through gRPC with capture on vs the engine called in-process, concurrency 1,
   same prompts (interleaved A/B so machine noise hits both).      target <= 1.10x
2. batching: requests/s with 8 concurrent clients vs sequential, same prompts.   target >= 3x
3. kafka-down: latency p50 with the broker stopped vs running (a private broker on free ports, never
   the shared one); after it returns, every interaction is on the topic exactly once.   target <= 1.2x

    .venv/bin/python load/inference_bench.py                 # all three, tiny model
    .venv/bin/python load/inference_bench.py --only batching --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.inference.client import InferenceClient  # noqa: E402
from services.inference.engines.base import GenerationRequest  # noqa: E402
from shared.contracts.topic_access import ADMIN  # noqa: E402
from shared.contracts.topics import Topics  # noqa: E402
from shared.decoding.generation import encode_prompt, render_chat  # noqa: E402
from shared.decoding.params import SamplingConfig  # noqa: E402
from shared.kafka.admin import delete_topics, ensure_topics  # noqa: E402
from shared.proto.apprentice.v1 import events_pb2  # noqa: E402
from tests.helpers.inference import start_inference  # noqa: E402
from tests.helpers.kafka import collect, private_broker  # noqa: E402

QUESTIONS = [f"Customer {i}: my order #{1000 + i} has not arrived, what should I do?" for i in range(8)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def row(name: str, base: str, value: str, ratio: float | None, target: str, ok: bool) -> None:
    r = f"{ratio:6.2f}x" if ratio is not None else f"{'-':>7}"
    print(f"| {name:<28} | {base:<22} | {value:<22} | {r} | {target:<8} | {'ok' if ok else 'MISS':<4} |")


def header() -> None:
    print(f"| {'benchmark':<28} | {'baseline':<22} | {'measured':<22} | {'ratio':>7} | {'target':<8} | {'':<4} |")
    print(f"|{'-' * 30}|{'-' * 24}|{'-' * 24}|{'-' * 9}|{'-' * 10}|{'-' * 6}|")


def spawn_server(model: str, bootstrap: str, prefix: str, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The service as its own process (`python -m services.inference`), as it is deployed: its threads
    do not share an interpreter lock with the benchmark's clients."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_KAFKA_BOOTSTRAP=bootstrap,
               APPRENTICE_TOPIC_PREFIX=prefix, APPRENTICE_HOME=str(tmp), APPRENTICE_INFERENCE_PORT=str(port),
               APPRENTICE_INFERENCE_HOST="127.0.0.1", APPRENTICE_INFERENCE_METRICS_PORT="0",
               APPRENTICE_INFERENCE_HTTP_PORT="0", APPRENTICE_INFERENCE_FOLLOW_UPDATES="false", APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0",
               APPRENTICE_INFERENCE_POD_ID=f"bench-{uuid.uuid4().hex[:6]}", APPRENTICE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "services.inference"], env=env,
                            cwd=Path(__file__).resolve().parents[1])
    return proc, port


# --- 1. gateway overhead --------------------------------------------------------------------------
def gateway(engine: Any, client: InferenceClient, rounds: int, max_new: int) -> tuple[float, float, float, float]:
    tok = engine.tokenizer
    ids = [encode_prompt(tok, render_chat(tok, [{"role": "user", "content": q}])) for q in QUESTIONS]
    cfg = SamplingConfig(max_new_tokens=max_new)

    def in_process(i: int) -> float:
        t0 = time.perf_counter()
        engine.submit(GenerationRequest(request_id=str(i), prompt_ids=ids[i % len(ids)], sampling=cfg)).result()
        return time.perf_counter() - t0

    def through_grpc(i: int) -> float:
        t0 = time.perf_counter()
        r = client.generate(QUESTIONS[i % len(QUESTIONS)], max_new_tokens=max_new)
        assert r.choices[0].token_count > 0
        return time.perf_counter() - t0

    for i in range(4):
        in_process(i)
        through_grpc(i)                                       # warm-up
    a, b = [], []
    for i in range(rounds):                                    # interleaved A/B
        a.append(in_process(i))
        b.append(through_grpc(i))
    return statistics.median(a), pct(a, 0.95), statistics.median(b), pct(b, 0.95)


# --- 2. batching ----------------------------------------------------------------------------------
def batching(client: InferenceClient, per_client: int, max_new: int) -> tuple[float, float]:
    def one(i: int) -> None:
        client.generate(QUESTIONS[i % len(QUESTIONS)], max_new_tokens=max_new)

    n = 8 * per_client
    t0 = time.perf_counter()
    for i in range(n):
        one(i)
    sequential = n / (time.perf_counter() - t0)

    def worker(w: int) -> None:
        for k in range(per_client):
            one(w + 8 * k)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent = n / (time.perf_counter() - t0)
    return sequential, concurrent


# --- 3. kafka down --------------------------------------------------------------------------------
def kafka_down(model: str, n: int, max_new: int) -> tuple[float, float, int, int, int]:
    tmp = Path(tempfile.mkdtemp(prefix="inference-bench-"))
    broker = private_broker(tmp / "broker")
    broker.start(timeout=180)
    os.environ.update(broker.client_env(ADMIN))     # its clients (the pod, the reader) as the broker's admin
    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:6]}.")
    ensure_topics(broker.bootstrap, topics)
    app = start_inference(tmp / "pod", model=model, bootstrap=broker.bootstrap, topic_prefix=topics.prefix,
                          follow_updates=False, heartbeat_interval_s=0, pod_id="bench-kafka")
    ids: list[str] = []
    try:
        with InferenceClient(f"127.0.0.1:{app.port}") as c:
            def timed(k: int) -> float:
                t0 = time.perf_counter()
                r = c.generate(QUESTIONS[k % len(QUESTIONS)], max_new_tokens=max_new, session_id=f"s{k % 4}")
                ids.append(r.choices[0].interaction_id)
                return time.perf_counter() - t0

            for k in range(3):
                timed(k)
            up = [timed(k) for k in range(n)]
            assert app.capture.wait_idle(60), "capture did not drain with the broker up"
            broker.stop(timeout=2)
            down = [timed(k) for k in range(n)]
            spooled = app.capture.depth
            broker.start(timeout=180)
            assert app.capture.wait_idle(120), "capture did not drain after the broker returned"
        events = collect(broker.bootstrap, topics.interactions, events_pb2.Interaction, count=len(ids) + 10,
                         timeout=8)
        counts = Counter(e.interaction_id for e in events)
        missing = len(set(ids) - set(counts))
        dupes = sum(v - 1 for v in counts.values())
        return statistics.median(up), statistics.median(down), spooled, missing, dupes
    finally:
        app.stop(2)
        broker.stop(timeout=2)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--only", choices=("gateway", "batching", "kafka-down"))
    ap.add_argument("--bootstrap", default="127.0.0.1:9092", help="shared broker for benchmarks 1 and 2")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=30, help="gateway: requests per side")
    ap.add_argument("--per-client", type=int, default=3, help="batching: requests per client (8 clients)")
    ap.add_argument("--kafka-requests", type=int, default=20)
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="intra-op threads for every engine in the run (1: on a small shared machine two "
                         "threads wait on each other at every op and run several times slower)")
    ns = ap.parse_args(argv)
    os.environ["APPRENTICE_TORCH_THREADS"] = str(ns.torch_threads)
    results: list[tuple[str, str, str, float | None, str, bool]] = []

    if ns.only in (None, "gateway", "batching"):
        topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:6]}.")
        ensure_topics(ns.bootstrap, topics)
        server_home = Path(tempfile.mkdtemp(prefix="bench-"))
        proc, port = spawn_server(ns.model, ns.bootstrap, topics.prefix, server_home)
        try:
            with InferenceClient(f"127.0.0.1:{port}") as c:
                c.wait_ready(300)
                if ns.only in (None, "gateway"):
                    from services.inference.engines import create_engine
                    from services.inference.settings import InferenceSettings
                    from shared.settings import CommonSettings

                    engine = create_engine("transformers", InferenceSettings(common=CommonSettings(model=ns.model)))
                    engine.start()
                    a50, a95, b50, b95 = gateway(engine, c, ns.rounds, ns.max_new_tokens)
                    engine.shutdown(5)
                    results.append(("gateway overhead p50", f"in-process {a50 * 1000:.1f} ms",
                                    f"gRPC+capture {b50 * 1000:.1f} ms", b50 / a50, "<= 1.10", b50 / a50 <= 1.10))
                    results.append(("gateway overhead p95", f"in-process {a95 * 1000:.1f} ms",
                                    f"gRPC+capture {b95 * 1000:.1f} ms", b95 / a95, "<= 1.10", b95 / a95 <= 1.10))
                if ns.only in (None, "batching"):
                    seq, conc = batching(c, ns.per_client, ns.max_new_tokens)
                    results.append(("batching (8 clients)", f"sequential {seq:.2f} req/s",
                                    f"concurrent {conc:.2f} req/s", conc / seq, ">= 3", conc / seq >= 3))
        finally:
            proc.terminate()
            proc.wait(60)
            delete_topics(ns.bootstrap, [s.name for s in topics.specs()])
            shutil.rmtree(server_home, ignore_errors=True)

    if ns.only in (None, "kafka-down"):
        up, down, spooled, missing, dupes = kafka_down(ns.model, ns.kafka_requests, ns.max_new_tokens)
        results.append(("kafka down latency p50", f"broker up {up * 1000:.1f} ms", f"broker down {down * 1000:.1f} ms",
                        down / up, "<= 1.2", down / up <= 1.2))
        results.append(("after recovery: exactly once", f"{spooled} spooled", f"{missing} lost, {dupes} twice",
                        None, "0 and 0", missing == 0 and dupes == 0))

    print(f"\nmodel={ns.model} max_new_tokens={ns.max_new_tokens} torch_threads={ns.torch_threads}")
    header()
    for r in results:
        row(*r)
    return 0 if all(r[5] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
