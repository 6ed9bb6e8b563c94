"""Load generator acting as product backends: Generate calls over gRPC or the OpenAI-compatible HTTP API,
prompts from a task file, feedback at a given rate and delay, several tenants. Prints throughput, latency
percentiles and error counts; exits non-zero when any request failed for good (after `--retry-s` of
retries).

Two ways to offer load:
- closed loop (`--qps 0`, the default): `--concurrency` workers, each sends its next request when the
  previous one is answered. The rate is whatever the server sustains at that concurrency.
- open loop (`--qps R`): requests arrive as a Poisson process of rate R (`--arrivals uniform`: evenly
  spaced) whether or not earlier ones were answered, as independent users do. At most `--max-in-flight`
  calls are outstanding; an arrival that finds them all busy is skipped and counted, with a warning.
  Latency is measured from each request's scheduled arrival. When the target rate is not reached (arrivals
  skipped, or this process falling behind its own schedule) a warning gives the rate achieved.

    python load/loadgen.py --target 127.0.0.1:50051 --duration 30 --qps 20 --tenants acme,globex \\
        --feedback-rate 0.5 --feedback-delay 2 --task support_desk
    python load/loadgen.py --protocol openai --target 127.0.0.1:8000 --qps 5 --duration 60

TLS and keys come from the environment as for every Apprentice client (`APPRENTICE_TLS_CA`,
`APPRENTICE_AUTH_TOKEN` / `APPRENTICE_AUTH_TOKEN_FILE`), or from `--ca` and `--api-key-file`.

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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load.loadgen_transports import (  # noqa: E402
    DEFAULT_TARGETS,
    PROTOCOLS,
    CallError,
    Transport,
    make_transport,
)
from shared.retry import call  # noqa: E402
from shared.settings import CommonSettings  # noqa: E402
from tools.tasks.task import check_answer, load_task  # noqa: E402

T = TypeVar("T")

# Retrying the same request cannot fix these: the call fails for good at once.
FATAL = {"INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED", "NOT_FOUND", "UNIMPLEMENTED"}
DEFAULT_MAX_IN_FLIGHT = 256
LAG_WARN_S = 1.0
"""The open loop warns when it is this far behind its own arrival schedule (a client that cannot keep up
would otherwise report the server's latency at a rate it never offered)."""
BOUND_WARN_EVERY_S = 10.0


@dataclass
class Attempt:
    """One call as the client saw it; wall-clock seconds, comparable with Kafka timestamps."""
    kind: str                 # generate | feedback
    tenant: str
    start: float
    end: float
    code: str                 # "OK" or the gRPC status name (HTTP statuses mapped to one)
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
    # open loop only
    target_qps: float = 0.0
    issued: int = 0                   # arrivals sent
    skipped: int = 0                  # arrivals not sent: --max-in-flight calls were outstanding
    arrival_window_s: float = 0.0     # how long arrivals were scheduled
    max_lag_s: float = 0.0            # how far this process fell behind its arrival schedule
    lock: threading.Lock = field(default_factory=threading.Lock)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def arrival_gaps(qps: float, arrivals: str, rng: random.Random) -> Iterator[float]:
    """Seconds between consecutive arrivals: exponential with mean 1/qps (a Poisson process: arrivals
    independent of each other and of the answers), or exactly 1/qps (`uniform`)."""
    if qps <= 0:
        raise ValueError("an open loop needs qps > 0")
    if arrivals == "poisson":
        while True:
            yield rng.expovariate(qps)
    elif arrivals == "uniform":
        while True:
            yield 1.0 / qps
    else:
        raise ValueError(f"unknown arrival process {arrivals!r}; choose poisson or uniform")


def warn_stderr(message: str) -> None:
    print(f"loadgen: warning: {message}", file=sys.stderr, flush=True)


class LoadGenerator:
    def __init__(self, target: str, task_name: str, tenants: list[str], *, max_new_tokens: int, feedback_rate: float,
                 feedback_delay_s: float, seed: int = 0, timeout_s: float = 120.0, retry_s: float = 0.0,
                 thumbs_rate: float = 0.0, common: CommonSettings | None = None, protocol: str = "grpc",
                 max_connections: int = DEFAULT_MAX_IN_FLIGHT, warn: Callable[[str], None] = warn_stderr,
                 transport: Transport | None = None) -> None:
        """`retry_s`: how long a failed call keeps being retried (0 = never); `thumbs_rate`: share of the
        answers that get KPI feedback which also get a thumbs up/down `feedback_delay_s` later (a second
        feedback event, so graders emit a second revision). `common`: client settings (TLS CA, key).
        `protocol`: grpc (target host:port) or openai (target host:port or base URL of the HTTP API).
        `warn`: where warnings go (stderr). `transport`: a ready transport instead of one made from
        `protocol`, `target` and `common`."""
        self.transport = transport or make_transport(protocol, target, common, max_connections=max_connections)
        self.protocol = protocol
        self.task = load_task(task_name)
        self.questions = self.task.train_questions()
        self.tenants = tenants
        self.max_new_tokens, self.timeout_s, self.retry_s = max_new_tokens, timeout_s, retry_s
        self.feedback_rate, self.feedback_delay_s, self.thumbs_rate = feedback_rate, feedback_delay_s, thumbs_rate
        self.seed = seed
        self.rng = random.Random(seed)
        self.warn = warn
        self.stats = Stats()
        self._timers: list[threading.Timer] = []
        self._stop = threading.Event()
        self.elapsed_s = 0.0

    # --- one call, with retries --------------------------------------------------------------------
    def _call(self, kind: str, tenant: str, fn: Callable[..., T], version: Callable[[T], str] | None = None) -> T | None:
        """`fn(timeout=, wait=)` until it succeeds, fails fatally, or `retry_s` is spent; every attempt is
        recorded. None when the call failed for good."""
        def once() -> T:
            t0 = time.time()
            try:
                resp = fn(timeout=self.timeout_s, wait=self.retry_s > 0)
            except CallError as e:
                with self.stats.lock:
                    self.stats.attempts.append(Attempt(kind, tenant, t0, time.time(), e.code))
                    self.stats.errors[e.code] += 1
                raise
            with self.stats.lock:
                self.stats.attempts.append(Attempt(kind, tenant, t0, time.time(), "OK",
                                                   version(resp) if version else ""))
            return resp

        try:   # no attempt starts after `retry_s`
            return call(once, retry_on=lambda e: isinstance(e, CallError) and e.code not in FATAL, what=kind,
                        attempts=None, deadline_s=self.retry_s, first_s=0.2, max_s=2.0)
        except CallError:
            with self.stats.lock:
                self.stats.failed[kind] += 1
            return None

    def one(self, scheduled: float | None = None) -> None:
        """One Generate (and maybe its feedback later). `scheduled`: the perf_counter time the request
        was due (open loop); latency counts from it, so time spent waiting for this process is included."""
        with self.stats.lock:   # one RNG shared by the callers' threads
            fact, question = self.rng.choice(self.questions)
            tenant = self.rng.choice(self.tenants)
            give_feedback = self.rng.random() < self.feedback_rate
            thumbs = (1.0 if self.rng.random() < 0.5 else -1.0) if self.rng.random() < self.thumbs_rate else None
        messages = self.task.messages(question)
        session = f"load-{uuid.uuid4().hex[:10]}"
        t0 = time.perf_counter() if scheduled is None else scheduled
        resp = self._call("generate", tenant, lambda **kw: self.transport.generate(
            messages, tenant=tenant, session_id=session, task=self.task.task, max_new_tokens=self.max_new_tokens,
            **kw), lambda r: r.version)
        if resp is None:
            return
        ms = (time.perf_counter() - t0) * 1000
        now = time.time()
        with self.stats.lock:
            self.stats.latencies_ms.append(ms)
            self.stats.versions[resp.version] += 1
            for iid in resp.interaction_ids:
                self.stats.interaction_ids.append(iid)
                self.stats.served[iid] = Served(iid, tenant, resp.version, now)
        if give_feedback and resp.interaction_ids:
            resolved = check_answer(fact, resp.text).value >= 1
            t = threading.Timer(self.feedback_delay_s, self._send_feedback,
                                (resp.interaction_ids[0], tenant, resolved, thumbs))
            t.daemon = True
            t.start()
            with self.stats.lock:
                self._timers.append(t)

    def _send_feedback(self, interaction_id: str, tenant: str, resolved: bool, thumbs: float | None) -> None:
        self._submit(interaction_id, tenant, "kpi", float(resolved), self.task.kpi.name)
        if thumbs is not None:
            time.sleep(self.feedback_delay_s)
            self._submit(interaction_id, tenant, "thumbs", thumbs, "")

    def _submit(self, interaction_id: str, tenant: str, kind: str, value: float, kpi_name: str) -> None:
        occurred_at = datetime.now(UTC)   # fixed across retries: same event id, recognisable repeat
        ack = self._call("feedback", tenant, lambda **kw: self.transport.feedback(
            interaction_id=interaction_id, tenant=tenant, kind=kind, value=value, kpi_name=kpi_name,
            occurred_at=occurred_at, **kw))
        with self.stats.lock:
            if ack is None:
                self.stats.feedback_errors += 1
                return
            self.stats.feedback_sent += 1
            served = self.stats.served.get(interaction_id)
            if served is not None and ack.accepted:
                served.feedback_ids.append(ack.event_id)

    # --- the run -----------------------------------------------------------------------------------
    def run(self, *, duration_s: float, concurrency: int, qps: float, max_requests: int,
            max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, arrivals: str = "poisson") -> Stats:
        """Until `duration_s`, `max_requests` or `stop()`; then waits for the calls in flight and the
        feedback still due. `qps` > 0: open loop (arrivals at `qps`, at most `max_in_flight` outstanding,
        `concurrency` unused); 0: closed loop with `concurrency` workers."""
        start = time.monotonic()
        if qps > 0:
            self._open_loop(duration_s, qps, max_requests, max_in_flight, arrivals)
        else:
            self._closed_loop(start, duration_s, concurrency, max_requests)
        for t in list(self._timers):
            t.join(2 * self.feedback_delay_s + 2 * (self.timeout_s + self.retry_s))
        self.elapsed_s = time.monotonic() - start
        return self.stats

    def _closed_loop(self, start: float, duration_s: float, concurrency: int, max_requests: int) -> None:
        deadline = start + duration_s
        issued = 0
        issued_lock = threading.Lock()

        def worker() -> None:
            nonlocal issued
            while time.monotonic() < deadline and not self._stop.is_set():
                with issued_lock:
                    if issued >= max_requests:
                        return
                    issued += 1
                self.one()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration_s + self.timeout_s + self.retry_s)

    def _open_loop(self, duration_s: float, qps: float, max_requests: int, max_in_flight: int,
                   arrivals: str) -> None:
        """Arrival k is due at the sum of k gaps (exponential with mean 1/qps for a Poisson process); the
        dispatcher never waits for an answer, only for the next due time."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if arrivals not in ("poisson", "uniform"):
            raise ValueError(f"unknown arrival process {arrivals!r}; choose poisson or uniform")
        gaps = arrival_gaps(qps, arrivals, random.Random(self.seed + 1))
        slots = threading.BoundedSemaphore(max_in_flight)
        s = self.stats
        s.target_qps = qps
        t_start, deadline = time.perf_counter(), time.perf_counter() + duration_s
        due = t_start
        last_bound_warning = -BOUND_WARN_EVERY_S
        lag_warned = False

        def arrival(scheduled: float) -> None:
            try:
                self.one(scheduled)
            except Exception as e:  # noqa: BLE001 - a bug or an unreadable answer: counted and shown
                with s.lock:
                    s.errors[f"CLIENT_{type(e).__name__}"] += 1
                    s.failed["generate"] += 1
                self.warn(f"a call failed in this client: {type(e).__name__}: {e}")
            finally:
                slots.release()

        with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="loadgen") as pool:
            while not self._stop.is_set() and s.issued < max_requests:
                due += next(gaps)
                if due >= deadline:
                    break
                if self._stop.wait(max(0.0, due - time.perf_counter())):
                    break
                now = time.perf_counter()
                lag = now - due
                if lag > s.max_lag_s:
                    s.max_lag_s = lag
                if lag > LAG_WARN_S and not lag_warned:
                    lag_warned = True
                    self.warn(f"this process is {lag:.1f}s behind its arrival schedule at {now - t_start:.0f}s "
                              f"into the run: it cannot send {qps:g} req/s (CPU-bound? run several loadgens)")
                if not slots.acquire(blocking=False):
                    s.skipped += 1
                    if now - last_bound_warning >= BOUND_WARN_EVERY_S:
                        last_bound_warning = now
                        self.warn(f"--max-in-flight {max_in_flight} calls outstanding at {now - t_start:.0f}s "
                                  f"into the run: {s.skipped} arrival(s) skipped so far (the server answers "
                                  f"fewer than --qps {qps:g} req/s)")
                    continue
                s.issued += 1
                pool.submit(arrival, due)
            s.arrival_window_s = min(time.perf_counter(), deadline) - t_start
        ok = len(s.latencies_ms)
        achieved = ok / s.arrival_window_s if s.arrival_window_s > 0 else 0.0
        if s.skipped or s.max_lag_s > LAG_WARN_S:
            self.warn(f"target {qps:g} req/s not reached: achieved {achieved:.2f} req/s answered "
                      f"({s.issued} sent, {s.skipped} skipped at --max-in-flight {max_in_flight}, "
                      f"{sum(s.failed.values())} failed, max schedule lag {s.max_lag_s:.2f}s) "
                      f"over {s.arrival_window_s:.1f}s")

    def stop(self) -> None:
        """Issue no new request (calls in flight and due feedback still complete)."""
        self._stop.set()

    def close(self) -> None:
        self.transport.close()


def summary(stats: Stats, elapsed_s: float) -> dict[str, Any]:
    n = len(stats.latencies_ms)
    out = {"requests_ok": n, "errors": dict(stats.errors), "failed": dict(stats.failed),
           "throughput_rps": n / elapsed_s if elapsed_s else 0.0,
           "p50_ms": percentile(stats.latencies_ms, 50), "p95_ms": percentile(stats.latencies_ms, 95),
           "p99_ms": percentile(stats.latencies_ms, 99), "feedback_sent": stats.feedback_sent,
           "feedback_errors": stats.feedback_errors, "versions": dict(stats.versions)}
    if stats.target_qps:
        window = stats.arrival_window_s
        out.update(target_qps=stats.target_qps, issued=stats.issued, skipped=stats.skipped,
                   offered_rps=stats.issued / window if window else 0.0,
                   achieved_rps=n / window if window else 0.0, max_lag_s=stats.max_lag_s)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="loadgen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", choices=PROTOCOLS, default="grpc",
                    help="grpc: apprentice.v1.Inference/Generate and Feedback/Submit; openai: POST "
                         "/v1/chat/completions and /v1/feedback of the HTTP API (default: %(default)s)")
    ap.add_argument("--target", default=None,
                    help=f"grpc: host:port (default {DEFAULT_TARGETS['grpc']}); openai: host:port or base URL "
                         f"(default {DEFAULT_TARGETS['openai']}; https when a CA is given)")
    ap.add_argument("--task", default="support_desk", help="task file whose questions are asked (default: %(default)s)")
    ap.add_argument("--tenants", default="demo", help="comma-separated tenants, one drawn per request")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load (default: %(default)s)")
    ap.add_argument("--qps", type=float, default=0.0,
                    help="open loop: requests arrive at this rate whether or not earlier ones were answered; "
                         "0 = closed loop with --concurrency workers (default: %(default)s)")
    ap.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson",
                    help="open loop: exponential gaps (Poisson process) or evenly spaced (default: %(default)s)")
    ap.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT,
                    help="open loop: most calls outstanding at once; an arrival beyond it is skipped and counted, "
                         "with a warning (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=4,
                    help="closed loop (--qps 0): workers, each waiting for its answer (default: %(default)s)")
    ap.add_argument("--max-requests", type=int, default=10_000, help="stop after this many requests")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens per answer (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=120.0, help="deadline of each call in seconds")
    ap.add_argument("--feedback-rate", type=float, default=0.5, help="share of answers that get KPI feedback")
    ap.add_argument("--feedback-delay", type=float, default=1.0, help="seconds between an answer and its feedback")
    ap.add_argument("--thumbs-rate", type=float, default=0.0, help="share of feedback that also gets a thumbs")
    ap.add_argument("--retry-s", type=float, default=0.0, help="retry failed calls this long (0 = never)")
    ap.add_argument("--seed", type=int, default=0, help="seeds questions, tenants and arrival gaps")
    ap.add_argument("--ca", type=Path, default=None,
                    help="CA certificate that verifies the server (TLS); default: APPRENTICE_TLS_CA")
    ap.add_argument("--api-key-file", type=Path, default=None,
                    help="file holding the bearer key; default: APPRENTICE_AUTH_TOKEN(_FILE)")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    updates: dict[str, Any] = {}
    if ns.ca is not None:
        updates["tls_ca"] = ns.ca
    if ns.api_key_file is not None:
        updates.update(auth_token_file=ns.api_key_file, auth_token=SecretStr(""))
    common = CommonSettings().model_copy(update=updates)
    gen = LoadGenerator(ns.target or DEFAULT_TARGETS[ns.protocol], ns.task, ns.tenants.split(","),
                        max_new_tokens=ns.max_new_tokens, feedback_rate=ns.feedback_rate,
                        feedback_delay_s=ns.feedback_delay, retry_s=ns.retry_s, thumbs_rate=ns.thumbs_rate,
                        timeout_s=ns.timeout, seed=ns.seed, common=common, protocol=ns.protocol,
                        max_connections=max(ns.max_in_flight, ns.concurrency))
    try:
        stats = gen.run(duration_s=ns.duration, concurrency=ns.concurrency, qps=ns.qps,
                        max_requests=ns.max_requests, max_in_flight=ns.max_in_flight, arrivals=ns.arrivals)
    finally:
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
        if stats.target_qps:
            print(f"open loop: target {s['target_qps']:g} req/s, offered {s['offered_rps']:.2f}, answered "
                  f"{s['achieved_rps']:.2f}; {s['skipped']} arrivals skipped at --max-in-flight")
        print(f"versions served: {dict(stats.versions)}; errors: {dict(stats.errors) or 'none'}")
    return 1 if stats.failed else 0


if __name__ == "__main__":
    sys.exit(main())
