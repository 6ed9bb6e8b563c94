"""Deployment prompts + knowledge --> one OEL consolidation round: the student learns, without the
knowledge in context, to act as the round-start model does with it (OEL, arXiv 2603.16856).

Methods (selectable, because docs/oel-probe.md found pure on-policy reverse KL a slow lever for a 135M model):
- rkl_topk: y ~ π_θ(·|x) (on-policy); loss = token-mean over y of the student-top-k reverse KL to the
  teacher π_k(·|c, x, y<t) (docs/architecture.md §7, k = 256).
- gkd: a fraction λ of the sequences is sampled from the teacher (with c); those take the forward KL over
  the teacher's top-k, the rest the reverse KL (GKD, Agarwal et al. 2024).
- sft_items: drills per item (questions, paraphrases, answer-term-filtered teacher answers, replay):
  services/trainer/drill.py, dispatched by services/trainer/rounds.py.
- sft_filtered: y ~ π_k(·|c, x); samples that pass the filter (a grader/verifier given by the caller, else
  the teacher's own confidence), ended by themselves and do not repeat themselves (share of repeated
  3-grams at most `sft_max_repetition`: a sample that loops on the fact still passes an answer check, and
  imitating it, or an answer cut at the length limit, teaches the loop, which the eval gate then refuses)
  become supervised targets for π_θ(·|x).

The teacher is a frozen snapshot taken by the caller at round start; the next round snapshots the
consolidated model, so the teacher follows the student (on-policy consistency).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from services.trainer import losses
from services.trainer.batching import make_batch, micro_batches
from services.trainer.distributed import broadcast, rank, shard
from services.trainer.knowledge import KnowledgeBase
from services.trainer.logprobs import score, supports_fused_head, teacher_view
from services.trainer.policy import Policy
from services.trainer.steplog import StepHook
from shared.decoding.chat_template import encode_chat, encode_text
from shared.decoding.generation import generate
from shared.decoding.params import SamplingConfig
from shared.decoding.repetition import repetition_rate
from shared.knowledge.frame import with_knowledge
from shared.knowledge.retrieval import tfidf_rank
from shared.progress import progress

METHODS = ("rkl_topk", "gkd", "sft_filtered", "sft_items")


@dataclass
class DistillExample:
    messages: list[dict[str, str]]          # the deployment prompt, without knowledge
    task: str = ""
    reference: str | None = None            # a known good answer, only for the progress metric (gold NLL)


ContextFn = Callable[[DistillExample, random.Random], list[str]]
AcceptFn = Callable[[DistillExample, str], bool]


@dataclass(frozen=True)
class DistillConfig:
    method: str = "rkl_topk"
    topk: int = 256
    gkd_lambda: float = 0.5
    batch: int = 8
    steps: int = 4
    micro_batch_size: int = 4
    max_new_tokens: int = 48
    temperature: float = 1.0
    sft_min_mean_logprob: float = -1.5
    sft_max_repetition: float = 0.1
    sft_finished_only: bool = True
    teacher_samples: int = 1
    seed: int = 0
    paraphrases: int = 3                    # sft_items (services/trainer/drill.py)
    replay_share: float = 0.25              # sft_items

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown distillation method {self.method!r}; use one of {METHODS}")

    @classmethod
    def from_settings(cls, s: Any) -> DistillConfig:
        return cls(method=s.distill_method, topk=s.distill_topk, gkd_lambda=s.gkd_lambda, batch=s.distill_batch,
                   steps=s.distill_steps, micro_batch_size=s.micro_batch_size,
                   max_new_tokens=s.distill_max_new_tokens, temperature=s.distill_temperature,
                   sft_min_mean_logprob=s.sft_min_mean_logprob, sft_max_repetition=s.sft_max_repetition,
                   sft_finished_only=s.sft_finished_only,
                   teacher_samples=s.teacher_samples, seed=s.seed, paraphrases=s.distill_paraphrases,
                   replay_share=s.distill_replay_share)


def context_from_base(kb: KnowledgeBase, retrieval: str, n_items: int) -> ContextFn:
    """Teacher context from the tenant's knowledge base (snapshot sampled per example)."""
    def fn(ex: DistillExample, rng: random.Random) -> list[str]:
        return kb.context(_query(ex.messages), ex.task, rng, retrieval=retrieval, n_items=n_items)
    return fn


def context_from_items(items: Sequence[str], retrieval: str = "tfidf", n_items: int = 3) -> ContextFn:
    """Teacher context from a fixed list of items (tests, probes); any retrieval but `all` ranks by TF-IDF."""
    items = list(items)

    def fn(ex: DistillExample, rng: random.Random) -> list[str]:
        if retrieval == "all" or len(items) <= n_items:
            return items
        return [items[i] for i in sorted(tfidf_rank(_query(ex.messages), items)[:n_items])]
    return fn


def _query(messages: Sequence[Mapping[str, str]]) -> str:
    return " ".join(m["content"] for m in messages if m["role"] == "user")


def confident(min_mean_logprob: float) -> Callable[[Sequence[float]], bool]:
    """Default SFT filter without a grader: the teacher's mean token log-prob is at least the threshold."""
    return lambda lps: bool(lps) and sum(lps) / len(lps) >= min_mean_logprob


def _sample(model: nn.Module, tok: Any, prompts: list[list[int]], cfg: DistillConfig, seed: int,
            n: int = 1) -> list[list[Any]]:
    was = model.training
    model.eval()
    params = [SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed + i, n=n)
              for i in range(len(prompts))]
    out = generate(model, tok, prompts, params)
    model.train(was)
    return out


def fluent_rows(samples: Sequence[Any], rows: Sequence[int], max_repetition: float,
                finished_only: bool = True) -> list[int]:
    """The rows whose sample ended by itself (where `finished_only`: a target cut at the length limit has no
    end-of-turn token, and imitating it teaches the student not to stop, the first step into a loop) and
    repeats itself no more than `max_repetition` (share of repeated token 3-grams,
    shared/decoding/repetition.py): the SFT targets worth imitating."""
    return [r for r in rows if (not finished_only or samples[r].finish_reason == "stop")
            and repetition_rate(samples[r].token_ids) <= max_repetition]


def _distinct(samples: Sequence[Any]) -> list[Any]:
    """Identical samples of one prompt once: a duplicate would only up-weight that sequence."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for s in samples:
        key = tuple(s.token_ids)
        if key and key not in seen:
            seen.add(key)
            out.append(s)
    return out


@torch.no_grad()
def gold_nll(policy: Policy, examples: Sequence[DistillExample], limit: int = 32) -> float | None:
    """Mean per-token NLL of the reference answers without knowledge (docs/oel-probe.md's progress metric)."""
    ex = [e for e in examples if e.reference][:limit]
    if not ex:
        return None
    tok = policy.tokenizer
    prompts = [encode_chat(tok, e.messages).ids for e in ex]
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    answers = [encode_text(tok, e.reference or "") + ([eos] if eos is not None else []) for e in ex]
    b = make_batch(prompts, answers, policy.pad_id).to(policy.device)
    was = policy.model.training
    policy.model.eval()
    with policy.autocast():
        lp = score(policy.model, b, policy.scorer.chunk).float()
    policy.model.train(was)
    return float(-(lp * b.completion_mask).sum() / b.completion_mask.sum())


def distill_step(policy: Policy, teacher: nn.Module, student_prompts: Sequence[Sequence[int]],
                 teacher_prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                 from_teacher: Sequence[bool], cfg: DistillConfig, *, t_fused: bool | None = None,
                 ) -> tuple[float, float, int, float]:
    """One optimizer step on given sequences (generation excluded; the benchmark times exactly this).

    Token-mean over all completion tokens of the step; micro-batches accumulate gradients. Rows sampled
    from the teacher take the forward KL over the teacher's top-k (GKD), the others the student-top-k
    reverse KL; under sft_filtered every row is a supervised target, under sft_items every row but the
    replay rows (`from_teacher`), which take the forward KL to the round-start model (services/trainer/drill.py). Returns (loss, sum of per-token KL
    (NLL for SFT), tokens, grad norm)."""
    dev = policy.device
    if t_fused is None:
        t_fused = supports_fused_head(teacher) and policy.scorer.fused
    n_tok = sum(len(y) for y in completions)           # step-wide normaliser
    rows = shard(range(len(completions)))               # torchrun: this rank's share
    loss_total: Any = 0.0
    kl_total: Any = 0.0
    for part, reverse in (([i for i in rows if from_teacher[i]], False), ([i for i in rows if not from_teacher[i]], True)):
        for mb_local in micro_batches([len(completions[i]) for i in part], cfg.micro_batch_size):
            mb = [part[j] for j in mb_local]
            ys = [completions[i] for i in mb]
            bs = make_batch([student_prompts[i] for i in mb], ys, policy.pad_id).to(dev)
            with policy.autocast():
                # supervised rows: every sft_filtered row, sft_items' drill rows; sft_items' replay rows (marked
                # from_teacher) take the forward KL to the round-start model over its top-k, as GKD's do
                if cfg.method == "sft_filtered" or (cfg.method == "sft_items" and reverse):
                    lp = bs.unflatten(policy.scorer(bs).float())
                    loss = losses.sft_nll(lp, bs.completion_mask, n_tok)
                    kl_sum = -(lp.detach() * bs.completion_mask).sum()
                else:
                    bt = make_batch([teacher_prompts[i] for i in mb], ys, policy.pad_id).to(dev)
                    view = teacher_view(teacher, bt, t_fused)
                    per_tok = policy.scorer(bs, teacher=view, k=cfg.topk, reverse=reverse)           # (N,)
                    loss = losses.token_mean(per_tok, torch.ones_like(per_tok), n_tok)
                    kl_sum = per_tok.detach().sum()
            loss.backward()
            loss_total += loss.detach()                    # tensors: no device sync per micro-batch
            kl_total += kl_sum
    return float(loss_total), float(kl_total), n_tok, policy.step()


def consolidation_round(policy: Policy, teacher: nn.Module, examples: Sequence[DistillExample],
                        context_fn: ContextFn, cfg: DistillConfig, *, accept: AcceptFn | None = None,
                        max_steps: int | None = None, on_step: StepHook | None = None) -> dict[str, float]:
    """Run `cfg.steps` optimizer steps of the chosen method on prompts drawn from `examples` (only those
    whose domain has knowledge). Returns metrics (loss, kl, tokens/s, acceptance, gold NLL before/after).
    `on_step` receives each optimizer step's own metrics (sampling time excluded from its tokens/s)."""
    t0 = time.perf_counter()
    rng = random.Random(cfg.seed)
    tok = policy.tokenizer
    t_fused = supports_fused_head(teacher) and policy.scorer.fused
    pool = [e for e in examples if context_fn(e, random.Random(0))]
    m: dict[str, float] = {"n_examples": float(len(pool)), "steps": 0.0, "tokens": 0.0, "loss": 0.0, "kl": 0.0,
                           "gen_seconds": 0.0, "samples": 0.0, "accepted": 0.0, "teacher_sampled": 0.0}
    before = gold_nll(policy, examples)
    if before is not None:
        m["gold_nll_before"] = before
    grad_norms: list[float] = []
    budget = cfg.steps if max_steps is None else min(cfg.steps, max_steps)
    # teacher sampling + one optimizer step per iteration; a bar on a terminal only (shared/progress.py)
    for step in progress(range(cfg.steps), total=budget, desc="consolidation", unit="step", leave=False):
        if not pool or (max_steps is not None and step >= max_steps):
            break
        chosen = rng.sample(pool, min(cfg.batch, len(pool)))
        ctx = [context_fn(e, rng) for e in chosen]
        # special tokens inside messages or knowledge stay text (shared/decoding/chat_template.py)
        s_ids = [encode_chat(tok, e.messages).ids for e in chosen]
        t_ids = [encode_chat(tok, with_knowledge(e.messages, c)).ids for e, c in zip(chosen, ctx, strict=True)]
        seed = (cfg.seed * 100_003 + policy.steps * 1_009) % (1 << 31)
        # 1) sequences: from the student (on-policy), the teacher (GKD share / SFT), or both
        n_teacher = {"rkl_topk": 0, "gkd": round(cfg.gkd_lambda * len(chosen)), "sft_filtered": len(chosen)}[cfg.method]
        per_prompt = cfg.teacher_samples if cfg.method == "sft_filtered" else 1
        g0 = time.perf_counter()
        drawn: Any = None
        if rank() == 0:           # torchrun: rank 0 samples, every rank trains on the same sequences
            from_teacher = _sample(teacher, tok, t_ids[:n_teacher], cfg, seed, per_prompt) if n_teacher else []
            from_student = (_sample(policy.model, tok, s_ids[n_teacher:], cfg, seed + 50_000)
                            if n_teacher < len(chosen) else [])
            drawn = [_distinct(g) if per_prompt > 1 else g[:1] for g in from_teacher + from_student]
        drawn = broadcast(drawn)
        m["gen_seconds"] += time.perf_counter() - g0
        # one row per sequence, remembering its prompt (several teacher samples per prompt under SFT)
        owner = [i for i, g in enumerate(drawn) for _ in g]
        samples = [s for g in drawn for s in g]
        m["samples"] += len(samples)
        m["teacher_sampled"] += sum(len(g) for g in drawn[:n_teacher])
        rows = [r for r, s in enumerate(samples) if s.token_ids]
        if cfg.method == "sft_filtered":
            conf = confident(cfg.sft_min_mean_logprob)
            fluent = fluent_rows(samples, rows, cfg.sft_max_repetition, cfg.sft_finished_only)
            m["rejected_repetitive"] = m.get("rejected_repetitive", 0.0) + len(rows) - len(fluent)
            rows = [r for r in fluent if (accept(chosen[owner[r]], samples[r].text) if accept
                                          else conf(samples[r].logprobs_t1))]
            m["accepted"] += len(rows)
        if not rows:
            continue
        ys = [samples[r].token_ids for r in rows]
        s0 = time.perf_counter()
        loss, kl_sum, n_tok, gnorm = distill_step(
            policy, teacher, [s_ids[owner[r]] for r in rows], [t_ids[owner[r]] for r in rows], ys,
            [owner[r] < n_teacher for r in rows], cfg, t_fused=t_fused)
        m["loss"] += loss
        m["kl"] += kl_sum
        m["tokens"] += n_tok
        grad_norms.append(gnorm)
        m["steps"] += 1
        if on_step is not None:
            seconds = time.perf_counter() - s0
            on_step({"loss": loss, "kl": kl_sum / max(n_tok, 1), "grad_norm": gnorm, "tokens": float(n_tok),
                     "seconds": seconds, "tokens_per_s": n_tok / max(seconds, 1e-9),
                     "response_length": n_tok / len(ys), "samples": float(len(samples)), "trained": float(len(ys)),
                     "lr": policy.last_lr})
    elapsed = time.perf_counter() - t0
    m["kl"] = m["kl"] / max(m["tokens"], 1)          # per token (NLL per token for sft_filtered)
    m["loss"] = m["loss"] / max(m["steps"], 1)
    m["grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
    m["seconds"] = elapsed
    m["tokens_per_s"] = m["tokens"] / max(elapsed - m["gen_seconds"], 1e-9)
    after = gold_nll(policy, examples)
    if after is not None:
        m["gold_nll_after"] = after
    return m
