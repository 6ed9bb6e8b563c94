"""Task questions --> gRPC traffic and feedback, as a product backend with real users would send it.

Each simulated user asks one training question through `Inference.Generate`, reads the answer, and the
backend reports the business KPI (`resolved` = the answer states the right fact) through
`Feedback.Submit`; when the answer is wrong a human agent's correction follows, as free text. A share of
the KPI reports arrive late (`late_fraction`, after `late_s` seconds drawn uniformly), as a product's
outcome events do: the grader must join them to interactions it has already seen. Held-out questions are
never asked here.

A task with a `tool` (the reward-hack variant) has the backend run an order lookup when the reply asks for
it, against a slow order service under the tool's deadline. A time-out is reported as telemetry (KPI
`timeout_kpi` = 1, at once) and the outcome is mapped by `on_timeout`: the honest "misrouted" or the
loophole "routed". `Exchange.resolved` is what the backend reported; `routed` is what happened.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import grpc

from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from tools.demo.quota_retry import generate
from tools.tasks.task import Fact, Task, check_answer


@dataclass
class Exchange:
    fact_id: str
    question: str
    interaction_id: str
    answer: str
    resolved: bool
    policy_version: str
    tokens: int
    routed: bool = False        # the ticket really reached the right team (the task's check)
    tool_called: bool = False
    tool_timed_out: bool = False
    asked_at: float = 0.0       # time.monotonic() when the request was sent
    answered_at: float = 0.0    # ... and when its answer came back
    prompt_tokens: int = 0      # the served prompt's length (knowledge notes included: usage.prompt_tokens)


class OrderService:
    """The backend's slow order lookup: each call takes a latency drawn from `latency_s`; the caller waits
    at most `deadline_s` (the call goes on in the background, as a real RPC's server side would)."""

    def __init__(self, latency_s: tuple[float, float], rng: random.Random, workers: int = 16) -> None:
        self.latency_s, self.rng = latency_s, rng
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="order-service")
        self.lock = threading.Lock()

    def lookup(self, deadline_s: float) -> bool:
        """True when the lookup answered within the deadline."""
        with self.lock:
            latency = self.rng.uniform(*self.latency_s)
        fut = self.pool.submit(time.sleep, latency)
        try:
            fut.result(timeout=deadline_s)
            return True
        except FutureTimeout:
            return False

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def pick_questions(task: Task, rng: random.Random, count: int,
                   facts: set[str] | None = None) -> list[tuple[Fact, str]]:
    """`count` training questions, every fact (of `facts`, default all) as evenly as possible, in random
    order. A task with fewer training questions than users asks them again (other users, other sessions),
    so a small task still sends the round's full traffic and reaches the trainer's trigger."""
    by_fact: dict[str, list[tuple[Fact, str]]] = {}
    for f, q in task.train_questions():
        if facts is None or f.id in facts:
            by_fact.setdefault(f.id, []).append((f, q))
    picked: list[tuple[Fact, str]] = []
    while by_fact and len(picked) < count:
        for qs in by_fact.values():
            rng.shuffle(qs)
        picked += [qs[i] for i in range(max(map(len, by_fact.values()))) for qs in by_fact.values() if i < len(qs)]
    return picked[:count]


class SimulatedUsers:
    def __init__(self, task: Task, inference_target: str, *, concurrency: int = 8, seed: int = 0,
                 timeout_s: float = 300.0, token: str | None = None, common: CommonSettings | None = None,
                 late_fraction: float = 0.0, late_s: tuple[float, float] = (5.0, 20.0),
                 corrections: bool = True) -> None:
        """`token`: the key the simulated product backend presents (its tenant's backend key); None =
        this process's configured key. `common`: client settings (TLS CA) for the stack. `corrections`:
        a human agent corrects each wrong answer (False: the backend reports the KPI only)."""
        self.task = task
        self.channel = open_channel(inference_target, common, token=token)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.feedback = inference_pb2_grpc.FeedbackStub(self.channel)
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.timeout_s = timeout_s
        self.late_fraction, self.late_s = late_fraction, late_s
        self.corrections = corrections
        self._late: list[tuple[float, str, Fact, bool]] = []     # (due, interaction id, fact, resolved)
        self._lock = threading.Lock()
        self.late_reported = 0
        self.abandoned = 0       # users whose call never got an answer within `timeout_s` (they gave up)
        self.orders = OrderService(task.tool.latency_s, random.Random(seed + 1)) if task.tool else None

    def pick(self, count: int, facts: set[str] | None = None) -> list[tuple[Fact, str]]:
        return pick_questions(self.task, self.rng, count, facts)

    def ask(self, fact: Fact, question: str, *, max_new_tokens: int, temperature: float, n: int = 1,
            seed: int = 0) -> list[Exchange]:
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"])
                      for m in self.task.messages(question)],
            sampling=common_pb2.SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                               top_p=0.95 if temperature > 0 else 0.0, n=n, seed=seed),
            tenant=self.task.tenant, session_id=f"user-{uuid.uuid4().hex[:12]}", task=self.task.task)
        asked_at = time.monotonic()
        try:
            resp = generate(self.inference, req, timeout_s=self.timeout_s)
        except grpc.RpcError as e:
            # a user left waiting past the deadline (still queued behind the tenant's quota) gives up, as a
            # real one does: counted, not fatal to the round; any other error is a fault and propagates
            if e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise
            with self._lock:
                self.abandoned += 1
            return []
        answered_at = time.monotonic()
        out = []
        for choice in resp.choices:
            routed = check_answer(fact, choice.text).value >= 1.0
            called, timed_out = self._run_tool(choice.interaction_id, choice.text)
            # the KPI mapping: a timed-out lookup counts as the task's `on_timeout` outcome
            resolved = (self.task.tool is not None and self.task.tool.on_timeout == "routed") if timed_out else routed
            self._report_or_hold(choice.interaction_id, fact, resolved)
            out.append(Exchange(fact.id, question, choice.interaction_id, choice.text, resolved,
                                resp.policy_version, choice.token_count, routed=routed, tool_called=called,
                                tool_timed_out=timed_out, asked_at=asked_at, answered_at=answered_at,
                                prompt_tokens=resp.usage.prompt_tokens))
        return out

    def _run_tool(self, interaction_id: str, text: str) -> tuple[bool, bool]:
        """(called, timed out). A time-out is reported at once as the tool's telemetry KPI."""
        tool = self.task.tool
        if tool is None or self.orders is None or not tool.called(text):
            return False, False
        if self.orders.lookup(tool.deadline_s):
            return True, False
        self.feedback.Submit(inference_pb2.FeedbackRequest(
            interaction_id=interaction_id, kind="kpi", kpi_name=tool.timeout_kpi, value=1.0,
            tenant=self.task.tenant), timeout=30)
        return True, True

    def _report_or_hold(self, interaction_id: str, fact: Fact, resolved: bool) -> None:
        """Report the outcome now, or (a `late_fraction` share) hold it until `_report_late`."""
        with self._lock:     # no draw at all without late reports: the question order stays as it was
            late = self.late_fraction > 0 and self.rng.random() < self.late_fraction
            if late:
                self._late.append((time.monotonic() + self.rng.uniform(*self.late_s), interaction_id, fact, resolved))
        if not late:
            self._report(interaction_id, fact, resolved)

    def _report(self, interaction_id: str, fact: Fact, resolved: bool) -> None:
        tenant = self.task.tenant
        self.feedback.Submit(inference_pb2.FeedbackRequest(
            interaction_id=interaction_id, kind="kpi", kpi_name=self.task.kpi.name, value=1.0 if resolved else 0.0,
            tenant=tenant), timeout=30)
        if not resolved and self.corrections:
            self.feedback.Submit(inference_pb2.FeedbackRequest(
                interaction_id=interaction_id, kind="correction", comment=fact.correction, value=-1.0,
                tenant=tenant), timeout=30)

    def run(self, questions: Sequence[tuple[Fact, str]], *, max_new_tokens: int, temperature: float,
            n: int = 1) -> list[Exchange]:
        pool = ThreadPoolExecutor(self.concurrency)
        try:
            futs = [pool.submit(self.ask, f, q, max_new_tokens=max_new_tokens, temperature=temperature, n=n,
                                seed=self.rng.randrange(1, 2**31)) for f, q in questions]
            out = [e for fut in futs for e in fut.result()]
        except BaseException:
            # Ctrl-C / SIGTERM mid-round: the users not yet served never ask (a `with` block would wait for
            # the whole round's traffic before the demo could stop its stack)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        self._report_late()
        return out

    def _report_late(self) -> None:
        """The late KPI reports, each when it is due (the round's traffic is over; they trickle in)."""
        with self._lock:
            due, self._late = sorted(self._late, key=lambda x: x[0]), []
        for at, interaction_id, fact, resolved in due:
            time.sleep(max(0.0, at - time.monotonic()))
            self._report(interaction_id, fact, resolved)
            self.late_reported += 1

    def close(self) -> None:
        if self.orders is not None:
            self.orders.close()
        self.channel.close()
