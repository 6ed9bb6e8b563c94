"""Load generator acting as product backends: gRPC Generate at a target QPS or concurrency, prompts from
a task file, feedback at a given rate and delay, several tenants. Prints throughput, latency percentiles
and error counts; exits non-zero when any request failed (chaos runs use that).

    python load/loadgen.py --target 127.0.0.1:50051 --duration 30 --concurrency 8 --tenants acme,globex \\
        --feedback-rate 0.5 --feedback-delay 2 --task support_desk

Traffic goes only to the address given (loopback in tests and CI). Every loop is bounded by --duration
and --max-requests.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from services.loop.task import check_answer, load_task  # noqa: E402
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc  # noqa: E402


@dataclass
class Stats:
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    feedback_sent: int = 0
    feedback_errors: int = 0
    versions: Counter[str] = field(default_factory=Counter)
    interaction_ids: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class LoadGenerator:
    def __init__(self, target: str, task_name: str, tenants: list[str], *, max_new_tokens: int, feedback_rate: float,
                 feedback_delay_s: float, seed: int = 0, timeout_s: float = 120.0) -> None:
        self.channel = grpc.insecure_channel(target)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.feedback = inference_pb2_grpc.FeedbackStub(self.channel)
        self.task = load_task(task_name)
        self.questions = self.task.train_questions()
        self.tenants = tenants
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s
        self.feedback_rate, self.feedback_delay_s = feedback_rate, feedback_delay_s
        self.rng = random.Random(seed)
        self.stats = Stats()
        self._timers: list[threading.Timer] = []

    def one(self) -> None:
        fact, question = self.rng.choice(self.questions)
        tenant = self.rng.choice(self.tenants)
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in self.task.messages(question)],
            sampling=common_pb2.SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.7, top_p=0.95),
            tenant=tenant, session_id=f"load-{uuid.uuid4().hex[:10]}", task=self.task.task)
        t0 = time.perf_counter()
        try:
            resp = self.inference.Generate(req, timeout=self.timeout_s)
        except grpc.RpcError as e:
            with self.stats.lock:
                self.stats.errors[e.code().name] += 1
            return
        ms = (time.perf_counter() - t0) * 1000
        with self.stats.lock:
            self.stats.latencies_ms.append(ms)
            self.stats.versions[resp.policy_version] += 1
            self.stats.interaction_ids.extend(c.interaction_id for c in resp.choices)
        if self.rng.random() < self.feedback_rate:
            resolved = check_answer(fact, resp.choices[0].text).value >= 1
            t = threading.Timer(self.feedback_delay_s, self._send_feedback, (resp.choices[0].interaction_id, tenant, resolved))
            t.daemon = True
            t.start()
            self._timers.append(t)

    def _send_feedback(self, interaction_id: str, tenant: str, resolved: bool) -> None:
        try:
            self.feedback.Submit(inference_pb2.FeedbackRequest(interaction_id=interaction_id, kind="kpi",
                                                               kpi_name=self.task.kpi.name, value=float(resolved),
                                                               tenant=tenant), timeout=30)
            with self.stats.lock:
                self.stats.feedback_sent += 1
        except grpc.RpcError:
            with self.stats.lock:
                self.stats.feedback_errors += 1

    def run(self, *, duration_s: float, concurrency: int, qps: float, max_requests: int) -> Stats:
        deadline = time.monotonic() + duration_s
        issued = 0
        issued_lock = threading.Lock()

        def worker() -> None:
            nonlocal issued
            while time.monotonic() < deadline:
                with issued_lock:
                    if issued >= max_requests:
                        return
                    issued += 1
                    slot = issued
                if qps > 0:  # open-loop pacing: request k is due at k / qps
                    delay = start + slot / qps - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                self.one()

        start = time.monotonic()
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration_s + self.timeout_s)
        for t in self._timers:
            t.join(self.feedback_delay_s + 30)
        self.elapsed_s = time.monotonic() - start
        return self.stats

    def close(self) -> None:
        self.channel.close()


def summary(stats: Stats, elapsed_s: float) -> dict[str, object]:
    n = len(stats.latencies_ms)
    return {"requests_ok": n, "errors": dict(stats.errors), "throughput_rps": n / elapsed_s if elapsed_s else 0.0,
            "p50_ms": percentile(stats.latencies_ms, 50), "p95_ms": percentile(stats.latencies_ms, 95),
            "p99_ms": percentile(stats.latencies_ms, 99), "feedback_sent": stats.feedback_sent,
            "feedback_errors": stats.feedback_errors, "versions": dict(stats.versions)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--task", default="support_desk")
    ap.add_argument("--tenants", default="demo")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--qps", type=float, default=0.0, help="target request rate; 0 = closed loop at --concurrency")
    ap.add_argument("--max-requests", type=int, default=10_000)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--feedback-rate", type=float, default=0.5)
    ap.add_argument("--feedback-delay", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    gen = LoadGenerator(ns.target, ns.task, ns.tenants.split(","), max_new_tokens=ns.max_new_tokens,
                        feedback_rate=ns.feedback_rate, feedback_delay_s=ns.feedback_delay)
    stats = gen.run(duration_s=ns.duration, concurrency=ns.concurrency, qps=ns.qps, max_requests=ns.max_requests)
    gen.close()
    s = summary(stats, gen.elapsed_s)
    if ns.json:
        print(json.dumps(s))
    else:
        print(f"{'requests':>10} {'errors':>8} {'req/s':>8} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'feedback':>9}")
        print(f"{s['requests_ok']:>10} {sum(stats.errors.values()):>8} {s['throughput_rps']:>8.2f} {s['p50_ms']:>9.1f} "
              f"{s['p95_ms']:>9.1f} {s['p99_ms']:>9.1f} {s['feedback_sent']:>9}")
        print(f"versions served: {dict(stats.versions)}; errors: {dict(stats.errors) or 'none'}")
    return 1 if stats.errors else 0


if __name__ == "__main__":
    sys.exit(main())
