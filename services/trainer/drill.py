"""Approved knowledge items --> supervised drills that put each item into the weights (consolidation method
`sft_items`), with a replay share that holds general behaviour.

Why a method of its own (docs/consolidation.md): the sampled-then-filtered rounds spent most of their time
drawing teacher answers to the few deployment prompts of a round and threw most of them away, so the weights
saw a few thousand tokens of each fact and held-out paraphrases stayed out of distribution. Here the round's
budget goes to training on many cheap examples per item, built only from what a deployment has:

1. Questions per item: the questions the item was learned from (its record), the deployment prompts the
   serving retriever answers with it, and paraphrases the round-start model writes of those questions
   (`paraphrases` per seed question). Any question in `exclude` (the evaluation's held-out questions, when
   the trainer is given them) is dropped, compared on normalised text.
2. Targets: the teacher (the round-start model with the item in its context, in the serving frame) answers
   each question `teacher_samples` times; a sample is kept when it ended by itself, does not repeat itself
   and holds the item's answer terms (shared/knowledge/terms.py, the gate's own check). A question whose
   samples all fail takes the item's own text as its target (the item is a correct answer by definition).
3. Replay: a share `replay_share` of every batch is general prompts (services/trainer/replay_prompts.py),
   asked with and without the tenant's system prompt, answered by the round-start model at T = 1; on those
   rows the student takes the forward KL to the round-start model's whole next-token distribution (over its
   top-k, as GKD's teacher rows), not the NLL of the one sample: the gate measures general behaviour as the
   log-likelihood of reference answers the model did not write, and NLL replay, greedy or sampled, let it
   fall by 0.51 and 0.59 nats/token in one round (docs/consolidation.md), past the gate's limit of 0.5.
   The replay prompts are not the gate's OOD questions.
4. Training: `steps` optimizer steps of `batch` rows of token-mean NLL (losses.sft_nll), cycling through the
   shuffled drill pool.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from services.trainer.distributed import broadcast, rank
from services.trainer.policy import Policy
from services.trainer.replay_prompts import REPLAY_PROMPTS
from shared.decoding.chat_template import encode_chat
from shared.decoding.generation import generate
from shared.decoding.params import SamplingConfig
from shared.decoding.repetition import repetition_rate
from shared.knowledge.check_questions import question_key, split_questions
from shared.knowledge.frame import with_knowledge
from shared.knowledge.terms import answer_holds, answer_terms

PARAPHRASE_PROMPT = ("Rewrite this customer question in {n} different ways. Keep its meaning. Write one question "
                     "per line and nothing else.\n\nQuestion: {q}")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|Q\d*[:.)])\s*")


@dataclass(frozen=True)
class DrillItem:
    text: str
    questions: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()

    checks: tuple[str, ...] = ()
    """Recorded questions the weights gate asks (shared/knowledge/check_questions.py): never drilled."""

    @classmethod
    def of(cls, text: str, questions: Iterable[str] = ()) -> DrillItem:
        recorded = [q.strip() for q in questions if q.strip()]
        train, check = split_questions(recorded)
        held = tuple(q for q in check if q not in train)
        return cls(text, tuple(train), tuple(answer_terms(text, recorded)), held)


@dataclass
class DrillPair:
    item: int                               # index into the round's items (-1: replay)
    prompt: list[int]                       # the student's prompt ids (no knowledge)
    target: list[int]                       # the answer's ids, end-of-turn included


@dataclass
class DrillStats:
    questions: int = 0
    generated_questions: int = 0
    excluded_questions: int = 0
    sampled: int = 0
    kept: int = 0
    fallback: int = 0
    replay: int = 0
    per_item_kept: dict[int, int] = field(default_factory=dict)


@dataclass
class DrillPlan:
    """A round's items, the deployment questions that retrieved each, and each item's system prompt (the one
    its deployment prompts carried, so the student learns the fact in the frame it is asked in)."""

    items: list[DrillItem]
    asked: dict[int, list[str]]
    systems: list[str]

    def system(self, i: int) -> str:
        return self.systems[i] if 0 <= i < len(self.systems) else ""


def drill_plan(examples: Sequence[Any], kb: Any, context: Callable[[Any, random.Random], list[str]],
               seed: int) -> DrillPlan:
    """The items to drill (the newest snapshot of each of the tenant's knowledge keys, with their recorded
    questions; or a fixed list of item texts), and which deployment prompts retrieve which item (`context`:
    the teacher's retrieval, the serving one by default)."""
    from services.trainer.knowledge import KnowledgeBase

    items: list[DrillItem] = []
    keys: list[str] = []
    if isinstance(kb, KnowledgeBase):
        for key, hist in kb.snapshots.items():
            snap = next((s for s in reversed(hist) if s.items), None)
            for e in snap.entries if snap is not None else ():
                items.append(DrillItem.of(e.text, e.questions))
                keys.append(key)
    else:
        items = [DrillItem.of(t) for t in kb]
        keys = [""] * len(items)
    index = {(k, it.text): i for i, (k, it) in enumerate(zip(keys, items, strict=True))}
    asked: dict[int, list[str]] = {}
    systems = [""] * len(items)
    rng = random.Random(seed)
    for ex in examples:
        key = kb.key_for(ex.task) if isinstance(kb, KnowledgeBase) else ""
        question = next((m["content"] for m in reversed(ex.messages) if m["role"] == "user"), "")
        system = next((m["content"] for m in ex.messages if m["role"] == "system"), "")
        for text in context(ex, rng):
            i = index.get((key, text))
            if i is None:
                continue
            if question:
                asked.setdefault(i, []).append(question)
            if system and not systems[i]:
                systems[i] = system
    for i, k in enumerate(keys):               # an item no prompt retrieved: its key's system prompt
        if not systems[i]:
            systems[i] = next((systems[j] for j, k2 in enumerate(keys) if k2 == k and systems[j]), "")
    return DrillPlan(items, asked, systems)


def excluded_questions(path: Path | None) -> list[str]:
    """The questions never to train on: one per line of `path` (none when unset)."""
    if path is None:
        return []
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


normalise_question = question_key


def parse_paraphrases(text: str, seed: str, limit: int) -> list[str]:
    """Lines of the model's paraphrase answer that read as questions: bullets and numbering stripped, 3 to 30
    words, ending in '?', not the seed itself; at most `limit`."""
    out: list[str] = []
    seen = {normalise_question(seed)}
    for line in text.splitlines():
        q = _BULLET.sub("", line).strip().strip('"').strip()
        words = q.split()
        if not q.endswith("?") or not 3 <= len(words) <= 30:
            continue
        key = normalise_question(q)
        if key in seen:
            continue
        seen.add(key)
        out.append(q)
        if len(out) >= limit:
            break
    return out


def _sample(model: nn.Module, tok: Any, prompts: list[list[int]], n: int, temperature: float, max_new_tokens: int,
            seed: int) -> list[list[Any]]:
    if not prompts:
        return []
    was = model.training
    model.eval()
    params = [SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i, n=n)
              for i in range(len(prompts))]
    try:
        return generate(model, tok, prompts, params)
    finally:
        model.train(was)


def _with_eos(tok: Any, ids: Sequence[int]) -> list[int]:
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    out = list(ids)
    if eos is not None and (not out or out[-1] != eos):
        out.append(eos)
    return out


def _question_messages(system: str, question: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]


def drill_questions(teacher: nn.Module, tok: Any, items: Sequence[DrillItem], asked: Mapping[int, Sequence[str]],
                    paraphrases: int, exclude: set[str], seed: int, stats: DrillStats) -> list[list[str]]:
    """Per item: its recorded questions, the deployment questions that retrieved it (`asked`), and up to
    `paraphrases` model-written rewrites of each of those; minus every question in `exclude`."""
    seeds = [list(dict.fromkeys([*it.questions, *asked.get(i, ())])) for i, it in enumerate(items)]
    generated: list[list[str]] = [[] for _ in items]
    if paraphrases > 0:            # an excluded question is not rewritten either: its paraphrases are it
        jobs = [(i, q) for i, qs in enumerate(seeds) for q in qs if normalise_question(q) not in exclude]
        prompts = [encode_chat(tok, [{"role": "user", "content": PARAPHRASE_PROMPT.format(n=paraphrases, q=q)}]).ids
                   for _, q in jobs]
        outs = _sample(teacher, tok, prompts, 1, 0.7, 24 * paraphrases, seed)
        for (i, q), out in zip(jobs, outs, strict=True):
            generated[i] += parse_paraphrases(out[0].text, q, paraphrases)
    result = []
    for i in range(len(items)):
        qs, seen = [], set()
        for q in [*seeds[i], *generated[i]]:
            key = normalise_question(q)
            if key in seen:
                continue
            seen.add(key)
            if key in exclude:
                stats.excluded_questions += 1
                continue
            qs.append(q)
        stats.generated_questions += sum(1 for q in generated[i] if q in qs)
        stats.questions += len(qs)
        result.append(qs)
    return result


def drill_pairs(teacher: nn.Module, tok: Any, items: Sequence[DrillItem], questions: Sequence[Sequence[str]],
                system: Callable[[int], str], *, samples: int, temperature: float, max_new_tokens: int,
                max_repetition: float, seed: int, stats: DrillStats) -> list[DrillPair]:
    """(question without knowledge --> kept teacher answer) pairs for every item (see the module docstring)."""
    jobs = [(i, q) for i, qs in enumerate(questions) for q in qs]
    t_prompts = [encode_chat(tok, with_knowledge(_question_messages(system(i), q), [items[i].text])).ids
                 for i, q in jobs]
    outs = _sample(teacher, tok, t_prompts, samples, temperature, max_new_tokens, seed)
    pairs: list[DrillPair] = []
    for (i, q), got in zip(jobs, outs, strict=True):
        student = encode_chat(tok, _question_messages(system(i), q)).ids
        kept, seen = 0, set()
        for s in got:
            stats.sampled += 1
            key = tuple(s.token_ids)
            if (not s.token_ids or key in seen or s.finish_reason != "stop"
                    or repetition_rate(s.token_ids) > max_repetition):
                continue
            if items[i].terms and not answer_holds(s.text, items[i].terms):
                continue
            seen.add(key)
            pairs.append(DrillPair(i, student, _with_eos(tok, s.token_ids)))
            kept += 1
        if not kept:
            stats.fallback += 1
            pairs.append(DrillPair(i, student, _with_eos(tok, tok.encode(items[i].text, add_special_tokens=False))))
        stats.kept += kept
        stats.per_item_kept[i] = stats.per_item_kept.get(i, 0) + kept
    return pairs


def replay_pairs(teacher: nn.Module, tok: Any, system: str, n: int, max_new_tokens: int, seed: int,
                 stats: DrillStats) -> list[DrillPair]:
    """The round-start model's own T=1 answers to `n` general prompts, every other one under the tenant's
    system prompt (those that ended by themselves and do not loop)."""
    rng = random.Random(seed)
    chosen = rng.sample(REPLAY_PROMPTS, min(n, len(REPLAY_PROMPTS)))
    prompts = [encode_chat(tok, _question_messages(system if i % 2 else "", q)).ids for i, q in enumerate(chosen)]
    outs = _sample(teacher, tok, prompts, 1, 1.0, max_new_tokens, seed)
    pairs = [DrillPair(-1, p, _with_eos(tok, o[0].token_ids)) for p, o in zip(prompts, outs, strict=True)
             if o[0].token_ids and o[0].finish_reason == "stop" and repetition_rate(o[0].token_ids) <= 0.1]
    stats.replay = len(pairs)
    return pairs


def batches(pairs: Sequence[DrillPair], replay: Sequence[DrillPair], steps: int, batch: int, replay_share: float,
            seed: int) -> list[list[DrillPair]]:
    """`steps` batches: round(batch * replay_share) replay rows each (when there are any), the rest cycling
    through the drill pool in shuffled passes (every pair once before any twice)."""
    rng = random.Random(seed)
    n_replay = round(batch * replay_share) if replay else 0
    order: list[DrillPair] = []
    out = []
    for _ in range(steps):
        rows: list[DrillPair] = []
        while len(rows) < batch - n_replay and pairs:
            if not order:
                order = list(pairs)
                rng.shuffle(order)
            rows.append(order.pop())
        rows += rng.sample(list(replay), min(n_replay, len(replay)))
        if rows:
            out.append(rows)
    return out


def drill_round(policy: Policy, teacher: nn.Module, items: Sequence[DrillItem], asked: Mapping[int, Sequence[str]],
                system: Callable[[int], str], cfg: Any, *, exclude: Iterable[str] = (),
                step_fn: Callable[[list[DrillPair]], tuple[float, float, int, float]],
                on_step: Callable[[dict[str, float]], None] | None = None) -> dict[str, float]:
    """One `sft_items` round: questions, targets, replay, then `cfg.steps` NLL steps through `step_fn`
    (which trains one batch, NLL on drill rows and KL on replay rows, and returns (loss, summed NLL and KL,
    tokens, grad norm))."""
    t0 = time.perf_counter()
    tok = policy.tokenizer
    stats = DrillStats()
    drawn: Any = None
    if rank() == 0:        # torchrun: rank 0 samples, every rank trains on the same drills
        excluded = {normalise_question(q) for q in [*exclude, *(c for it in items for c in it.checks)]}
        questions = drill_questions(teacher, tok, items, asked, cfg.paraphrases, excluded, cfg.seed, stats)
        pairs = drill_pairs(teacher, tok, items, questions, system, samples=cfg.teacher_samples,
                            temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                            max_repetition=cfg.sft_max_repetition, seed=cfg.seed + 7, stats=stats)
        replay = (replay_pairs(teacher, tok, system(0) if items else "", len(REPLAY_PROMPTS), cfg.max_new_tokens,
                               cfg.seed + 11, stats) if cfg.replay_share > 0 else [])
        drawn = (pairs, replay, stats)
    pairs, replay, stats = broadcast(drawn)
    gen_seconds = time.perf_counter() - t0
    m: dict[str, float] = {"n_items": float(len(items)), "questions": float(stats.questions),
                           "generated_questions": float(stats.generated_questions),
                           "excluded_questions": float(stats.excluded_questions), "samples": float(stats.sampled),
                           "accepted": float(stats.kept), "fallback_targets": float(stats.fallback),
                           "replay_pairs": float(stats.replay), "pairs": float(len(pairs)),
                           "items_without_kept_sample": float(sum(1 for i in range(len(items))
                                                                  if not stats.per_item_kept.get(i))),
                           "gen_seconds": gen_seconds, "steps": 0.0, "tokens": 0.0, "loss": 0.0, "kl": 0.0}
    grad_norms = []
    for rows in batches(pairs, replay, cfg.steps, cfg.batch, cfg.replay_share, cfg.seed + 13):
        s0 = time.perf_counter()
        loss, nll_sum, n_tok, gnorm = step_fn(rows)
        m["loss"] += loss
        m["kl"] += nll_sum
        m["tokens"] += n_tok
        m["steps"] += 1
        grad_norms.append(gnorm)
        if on_step is not None:
            sec = time.perf_counter() - s0
            on_step({"loss": loss, "kl": nll_sum / max(n_tok, 1), "grad_norm": gnorm, "tokens": float(n_tok),
                     "seconds": sec, "tokens_per_s": n_tok / max(sec, 1e-9), "trained": float(len(rows)),
                     "replay_rows": float(sum(1 for r in rows if r.item < 0)), "lr": policy.last_lr})
    elapsed = time.perf_counter() - t0
    m["kl"] = m["kl"] / max(m["tokens"], 1)
    m["loss"] = m["loss"] / max(m["steps"], 1)
    m["grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
    m["seconds"] = elapsed
    m["tokens_per_s"] = m["tokens"] / max(elapsed - gen_seconds, 1e-9)
    m["kept_fraction"] = stats.kept / max(stats.sampled, 1)
    return m
