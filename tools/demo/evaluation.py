"""Held-out and out-of-distribution questions --> success rates with 95% intervals, through the real
Inference service (`no_capture`, so evaluation traffic never becomes training data).

The OOD reading is the task's own `out_of_distribution` questions (asked with the task's system prompt,
as its users would) plus the general questions with checks that the weights gate scores
(`services/weights/evalsets/ood.yaml`, asked without a system prompt, as the gate asks them): six
questions alone cannot show a regression (one changed answer is 17 points), forty-odd can."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

from shared.grading.replies import reply_key
from shared.progress import progress
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from tools.demo.quota_retry import generate
from tools.demo.stats import wilson
from tools.tasks.config import general_ood_questions
from tools.tasks.task import OODItem, Task, check_answer, check_ood


@dataclass
class EvalResult:
    policy_version: str
    greedy_success: int
    greedy_total: int
    sampled_success: int
    sampled_total: int
    ood_success: int
    ood_total: int
    mean_response_tokens: float
    ood_general_success: int = 0     # the part of ood_success / ood_total from the packaged general questions
    ood_general_total: int = 0
    examples: list[dict[str, str]] = field(default_factory=list)
    per_question: list[list[int]] = field(default_factory=list)
    """[successes, trials] of each held-out message (greedy + sampled), in the task's held-out order: the
    paired, message-level interval of the report (tools/demo/stats.py) reads them."""
    per_fact: dict[str, list[int]] = field(default_factory=dict)
    """[successes, trials] per fact (per team on the routing task): where a change comes from."""
    top_reply: str = ""
    top_reply_share: float = 0.0
    """The most common greedy reply to the held-out questions and the share of questions that got it: a policy
    that answers every question alike (the routing task's "Billing, Shipping, ..." list, which routes every
    ticket to its first team) has collapsed, whatever its success rate (`report.summarize`)."""

    @property
    def success(self) -> int:
        """Headline count: greedy + sampled answers together."""
        return self.greedy_success + self.sampled_success

    @property
    def total(self) -> int:
        return self.greedy_total + self.sampled_total

    def as_dict(self) -> dict[str, object]:
        """JSON-shaped; a task without an OOD set has `ood_rate` and `ood_ci95` None (not a rate of 0)."""
        lo, hi = wilson(self.success, self.total)
        ood = self.ood_total > 0
        return {**asdict(self), "success_rate": self.success / max(1, self.total), "ci95": [lo, hi],
                "ood_rate": self.ood_success / self.ood_total if ood else None,
                "ood_ci95": list(wilson(self.ood_success, self.ood_total)) if ood else None}


def most_common_reply(replies: list[str]) -> tuple[str, float]:
    """The most common reply (compared as the grader's `constant_reply` compares them: `reply_key`) and its
    share of `replies` (("", 0.0) for none)."""
    if not replies:
        return "", 0.0
    norm = [reply_key(r) for r in replies]
    top, count = Counter(norm).most_common(1)[0]
    return top, count / len(norm)


class Evaluator:
    def __init__(self, task: Task, inference_target: str, *, samples: int, temperature: float = 0.7,
                 max_new_tokens: int = 48, concurrency: int = 8, timeout_s: float = 600.0,
                 common: CommonSettings | None = None, general_ood: list[OODItem] | None = None) -> None:
        self.task = task
        self.general_ood = general_ood_questions() if general_ood is None else general_ood
        self.channel = open_channel(inference_target, common)
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        self.samples, self.temperature, self.max_new_tokens = samples, temperature, max_new_tokens
        self.concurrency, self.timeout_s = concurrency, timeout_s

    def _ask(self, question: str, *, n: int, temperature: float, seed: int,
             system: bool = True, knowledge: bool = True) -> inference_pb2.GenerateResponse:
        chat = self.task.messages(question) if system else [{"role": "user", "content": question}]
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in chat],
            sampling=common_pb2.SamplingParams(max_new_tokens=self.max_new_tokens, temperature=temperature, n=n,
                                               seed=seed, top_p=0.95 if temperature > 0 else 0.0),
            tenant=self.task.tenant, task=self.task.task, no_capture=True, no_knowledge=not knowledge)
        return generate(self.stub, req, timeout_s=self.timeout_s)

    def run(self, round_index: int, *, knowledge: bool = True) -> EvalResult:
        """Held-out and OOD questions as served (`knowledge`: with the tenant's knowledge in context where the
        inference service adds it), or the weights alone (`knowledge=False`: the requests opt out)."""
        held = self.task.held_out_questions()
        kw = {"knowledge": knowledge}
        pool = ThreadPoolExecutor(self.concurrency)
        try:
            greedy = [pool.submit(self._ask, q, n=1, temperature=0.0, seed=0, **kw) for _, q in held]
            sampled = ([pool.submit(self._ask, q, n=self.samples, temperature=self.temperature,
                                    seed=1000 * round_index + i + 1, **kw) for i, (_, q) in enumerate(held)]
                       if self.samples else [])
            ood_items = [*self.task.out_of_distribution, *self.general_ood]
            n_task = len(self.task.out_of_distribution)
            ood = [pool.submit(self._ask, it.question, n=1, temperature=0.0, seed=0, system=i < n_task, **kw)
                   for i, it in enumerate(ood_items)]
            with progress(total=len(greedy) + len(sampled) + len(ood), desc=f"evaluation round {round_index}",
                          unit="request", leave=False) as bar:   # a terminal only (shared/progress.py)
                for _ in as_completed([*greedy, *sampled, *ood]):
                    bar.update()
            greedy_r = [f.result() for f in greedy]
            sampled_r = [f.result() for f in sampled]
            ood_r = [f.result() for f in ood]
        except BaseException:
            # Ctrl-C / SIGTERM mid-evaluation: the questions not yet asked are dropped (a `with` block would
            # ask them all before the demo could stop its stack)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        g_hits = [int(check_answer(f, r.choices[0].text).value >= 1) for (f, _), r in zip(held, greedy_r, strict=True)]
        s_hits = [sum(int(check_answer(f, c.text).value >= 1) for c in r.choices)
                  for (f, _), r in zip(held, sampled_r, strict=False)] or [0] * len(held)
        s_trials = [len(r.choices) for r in sampled_r] or [0] * len(held)
        g_ok, s_ok = sum(g_hits), sum(s_hits)
        o_hits = [check_ood(it, i, r.choices[0].text).value >= 1
                  for i, (it, r) in enumerate(zip(ood_items, ood_r, strict=True))]
        o_ok = sum(o_hits)
        tokens = [c.token_count for r in greedy_r + sampled_r for c in r.choices]
        versions = {r.policy_version for r in greedy_r}
        examples = [{"question": q, "answer": r.choices[0].text} for (_, q), r in list(zip(held, greedy_r, strict=True))[:4]]
        per_fact: dict[str, list[int]] = {}
        for (f, _), g, h, t in zip(held, g_hits, s_hits, s_trials, strict=True):
            acc = per_fact.setdefault(f.id, [0, 0])
            acc[0], acc[1] = acc[0] + g + h, acc[1] + 1 + t
        top_reply, top_share = most_common_reply([r.choices[0].text for r in greedy_r])
        return EvalResult(policy_version=",".join(sorted(versions)), greedy_success=int(g_ok), greedy_total=len(held),
                          sampled_success=int(s_ok), sampled_total=len(held) * self.samples, ood_success=int(o_ok),
                          ood_total=len(ood_r), mean_response_tokens=sum(tokens) / max(1, len(tokens)),
                          ood_general_success=int(sum(o_hits[n_task:])), ood_general_total=len(self.general_ood),
                          examples=examples,
                          per_question=[[g + h, 1 + t] for g, h, t in zip(g_hits, s_hits, s_trials, strict=True)],
                          per_fact=per_fact, top_reply=top_reply[:200], top_reply_share=top_share)

    def close(self) -> None:
        self.channel.close()
