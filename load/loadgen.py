"""Load generator acting as product backends: gRPC Generate at a target QPS or concurrency, prompts from
a task file, feedback at a given rate and delay, several tenants. Prints throughput, latency percentiles
and error counts; exits non-zero when any request failed for good (after `--retry-s` of retries).

    python load/loadgen.py --target 127.0.0.1:50051 --duration 30 --concurrency 8 --tenants acme,globex \\
        --feedback-rate 0.5 --feedback-delay 2 --task support_desk

Every call is recorded as an `Attempt` with wall-clock start and end, so a chaos run can line failures up
with what it broke and when (`load/chaos.py`). With `--retry-s`, a failed call is retried (backing off)
as a product backend would, and calls wait for a restarting server instead of failing fast; feedback
carries its `occurred_at` from the first attempt, so a retry has the same deterministic event id and the
pipeline can recognise the repeat.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from services.loop.task import check_answer, load_task  # noqa: E402
from shared.config import CommonSettings  # noqa: E402
from shared.events import timestamp  # noqa: E402
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc  # noqa: E402
from shared.security.channels import open_channel  # noqa: E402

T = TypeVar("T")

# Retrying the same request cannot fix these: the call fails for good at once.
FATAL = {"INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "NOT_FOUND", "UNIMPLEMENTED"}
# A restarted server is found again within a second (gRPC's default reconnect back-off grows to 2 min).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass
class Attempt:
    """One gRPC call as the client saw it; wall-clock seconds, comparable with Kafka timestamps."""
    kind: str                 # generate | feedback
    tenant: str
    start: float
    end: float
    code: str                 # "OK" or the gRPC status name
    version: str = ""         # generate: the policy version that answered


@dataclass
class Served:
    """An answer a client received, and the feedback events the Feedback service acknowledged for it."""
    interaction_id: str
    tenant: str
    version: str
    at: float
    feedback_ids: list[str] = field(default_factory=list)


@dataclass
class Stats:
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)        # failed attempts, by status
    failed: Counter[str] = field(default_factory=Counter)        # calls that failed for good, by kind
    feedback_sent: int = 0
    feedback_errors: int = 0
    versions: Counter[str] = field(default_factory=Counter)
    interaction_ids: list[str] = field(default_factory=list)
    served: dict[str, Served] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class LoadGenerator:
    def __init__(self, target: str, task_name: str, tenants: list[str], *, max_new_tokens: int, feedback_rate: float,
                 feedback_delay_s: float, seed: int = 0, timeout_s: float = 120.0, retry_s: float = 0.0,
                 thumbs_rate: float = 0.0, common: CommonSettings | None = None) -> None:
        """`retry_s`: how long a failed call keeps being retried (0 = never); `thumbs_rate`: share of the
        answers that get KPI feedback which also get a thumbs up/down `feedback_delay_s` later (a second
        feedback event, so graders emit a second revision). `common`: client settings (TLS CA, key)."""
        self.channel = open_channel(target, common, options=CHANNEL_OPTIONS)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.feedback = inference_pb2_grpc.FeedbackStub(self.channel)
        self.task = load_task(task_name)
        self.questions = self.task.train_questions()
        self.tenants = tenants
        self.max_new_tokens, self.timeout_s, self.retry_s = max_new_tokens, timeout_s, retry_s
        self.feedback_rate, self.feedback_delay_s, self.thumbs_rate = feedback_rate, feedback_delay_s, thumbs_rate
        self.rng = random.Random(seed)
        self.stats = Stats()
        self._timers: list[threading.Timer] = []
        self._stop = threading.Event()
        self.elapsed_s = 0.0

    # --- one call, with retries --------------------------------------------------------------------
    def _call(self, kind: str, tenant: str, fn: Callable[..., T], version: Callable[[T], str] | None = None) -> T | None:
        """`fn(timeout=, wait_for_ready=)` until it succeeds, fails fatally, or `retry_s` is spent; every
        attempt is recorded. None when the call failed for good."""
        first = time.time()
        backoff = 0.2
        while True:
            t0 = time.time()
            try:
                resp = fn(timeout=self.timeout_s, wait_for_ready=self.retry_s > 0)
            except grpc.RpcError as e:
                code = e.code().name
                with self.stats.lock:
                    self.stats.attempts.append(Attempt(kind, tenant, t0, time.time(), code))
                    self.stats.errors[code] += 1
                if code in FATAL or time.time() + backoff - first > self.retry_s:
                    with self.stats.lock:
                        self.stats.failed[kind] += 1
                    return None
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            with self.stats.lock:
                self.stats.attempts.append(Attempt(kind, tenant, t0, time.time(), "OK",
                                                   version(resp) if version else ""))
            return resp

    def one(self) -> None:
        fact, question = self.rng.choice(self.questions)
        tenant = self.rng.choice(self.tenants)
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in self.task.messages(question)],
            sampling=common_pb2.SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.7, top_p=0.95),
            tenant=tenant, session_id=f"load-{uuid.uuid4().hex[:10]}", task=self.task.task)
        t0 = time.perf_counter()
        resp = self._call("generate", tenant, lambda **kw: self.inference.Generate(req, **kw),
                          lambda r: r.policy_version)
        if resp is None:
            return
        ms = (time.perf_counter() - t0) * 1000
        now = time.time()
        with self.stats.lock:
            self.stats.latencies_ms.append(ms)
            self.stats.versions[resp.policy_version] += 1
            for c in resp.choices:
                self.stats.interaction_ids.append(c.interaction_id)
                self.stats.served[c.interaction_id] = Served(c.interaction_id, tenant, resp.policy_version, now)
        if self.rng.random() < self.feedback_rate:
            resolved = check_answer(fact, resp.choices[0].text).value >= 1
            thumbs = (1.0 if self.rng.random() < 0.5 else -1.0) if self.rng.random() < self.thumbs_rate else None
            t = threading.Timer(self.feedback_delay_s, self._send_feedback,
                                (resp.choices[0].interaction_id, tenant, resolved, thumbs))
            t.daemon = True
            t.start()
            self._timers.append(t)

    def _send_feedback(self, interaction_id: str, tenant: str, resolved: bool, thumbs: float | None) -> None:
        self._submit(inference_pb2.FeedbackRequest(interaction_id=interaction_id, kind="kpi", kpi_name=self.task.kpi.name,
                                                   value=float(resolved), tenant=tenant), tenant)
        if thumbs is not None:
            time.sleep(self.feedback_delay_s)
            self._submit(inference_pb2.FeedbackRequest(interaction_id=interaction_id, kind="thumbs", value=thumbs,
                                                       tenant=tenant), tenant)

    def _submit(self, req: inference_pb2.FeedbackRequest, tenant: str) -> None:
        req.occurred_at.CopyFrom(timestamp())   # fixed across retries: same event id, recognisable repeat
        ack = self._call("feedback", tenant, lambda **kw: self.feedback.Submit(req, **kw))
        with self.stats.lock:
            if ack is None:
                self.stats.feedback_errors += 1
                return
            self.stats.feedback_sent += 1
            served = self.stats.served.get(req.interaction_id)
            if served is not None and ack.accepted:
                served.feedback_ids.append(ack.event_id)

    # --- the run -----------------------------------------------------------------------------------
    def run(self, *, duration_s: float, concurrency: int, qps: float, max_requests: int) -> Stats:
        """Until `duration_s`, `max_requests` or `stop()`; then waits for the feedback still due."""
        deadline = time.monotonic() + duration_s
        issued = 0
        issued_lock = threading.Lock()

        def worker() -> None:
            nonlocal issued
            while time.monotonic() < deadline and not self._stop.is_set():
                with issued_lock:
                    if issued >= max_requests:
                        return
                    issued += 1
                    slot = issued
                if qps > 0:  # open-loop pacing: request k is due at k / qps
                    delay = start + slot / qps - time.monotonic()
                    if delay > 0 and self._stop.wait(delay):
                        return
                self.one()

        start = time.monotonic()
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration_s + self.timeout_s + self.retry_s)
        for t in self._timers:
            t.join(2 * self.feedback_delay_s + 2 * (self.timeout_s + self.retry_s))
        self.elapsed_s = time.monotonic() - start
        return self.stats

    def stop(self) -> None:
        """Issue no new request (calls in flight and due feedback still complete)."""
        self._stop.set()

    def close(self) -> None:
        self.channel.close()


def summary(stats: Stats, elapsed_s: float) -> dict[str, Any]:
    n = len(stats.latencies_ms)
    return {"requests_ok": n, "errors": dict(stats.errors), "failed": dict(stats.failed),
            "throughput_rps": n / elapsed_s if elapsed_s else 0.0,
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
    ap.add_argument("--thumbs-rate", type=float, default=0.0, help="share of feedback that also gets a thumbs")
    ap.add_argument("--retry-s", type=float, default=0.0, help="retry failed calls this long (0 = never)")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    gen = LoadGenerator(ns.target, ns.task, ns.tenants.split(","), max_new_tokens=ns.max_new_tokens,
                        feedback_rate=ns.feedback_rate, feedback_delay_s=ns.feedback_delay, retry_s=ns.retry_s,
                        thumbs_rate=ns.thumbs_rate)
    stats = gen.run(duration_s=ns.duration, concurrency=ns.concurrency, qps=ns.qps, max_requests=ns.max_requests)
    gen.close()
    s = summary(stats, gen.elapsed_s)
    if ns.json:
        print(json.dumps(s))
    else:
        print(f"{'requests':>10} {'errors':>8} {'failed':>8} {'req/s':>8} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} "
              f"{'feedback':>9}")
        print(f"{s['requests_ok']:>10} {sum(stats.errors.values()):>8} {sum(stats.failed.values()):>8} "
              f"{s['throughput_rps']:>8.2f} {s['p50_ms']:>9.1f} {s['p95_ms']:>9.1f} {s['p99_ms']:>9.1f} "
              f"{s['feedback_sent']:>9}")
        print(f"versions served: {dict(stats.versions)}; errors: {dict(stats.errors) or 'none'}")
    return 1 if stats.failed else 0


if __name__ == "__main__":
    sys.exit(main())
