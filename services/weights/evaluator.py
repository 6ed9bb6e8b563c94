"""Candidate version --> eval results against the version it would replace and the reference --> APPROVED
or REJECTED.

Loads the models on CPU, one at a time (the candidate from the store's blobs, hard-linked into a work
folder; the parent is the version the candidate's tenant is served now, or the base model; the reference
is the base model or the operator's pinned reference, settings `reference_version` /
`tenant_reference_versions`), scores them on the held-out and OOD sets (see gate.py for the checks) and
writes the results and the verdict into the candidate's manifest. One evaluation runs at a time. Scores
are cached per version, eval sets and settings (in memory and under `<store>/eval-cache/`, so a restart
scores neither the serving version nor the reference again): a candidate costs one model's evaluation,
its scores become the next candidate's parent scores, and the reference is scored once per eval sets.

With a knowledge view (knowledge.py), the loaded candidate is also asked its tenant's approved knowledge
items' questions without the items in context: one informational result per item (never blocks).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from services.weights.evalset import LoadedHeldout, OodSet, load_heldout, load_ood
from services.weights.gate import (
    KNOWLEDGE,
    PARENT,
    REFERENCE,
    Limits,
    ModelScores,
    coarse_limits,
    hacking_fraction,
    hacking_result,
    integrity_of,
    integrity_result,
    knowledge_result,
    regression_results,
    verdict,
)
from services.weights.knowledge import KnowledgeView
from services.weights.metrics import EVAL_SECONDS, EVALS, EVALS_RUNNING
from services.weights.settings import WeightsSettings
from services.weights.store import WeightStore
from shared.contracts.orders import BASE
from shared.decoding.chat_template import encode_chat, encode_text
from shared.decoding.repetition import repetition_rate
from shared.grading import grade_rule, parse_rule_spec
from shared.models import load_model, load_tokenizer, resolve_model_dir
from shared.progress import progress
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import FailedPrecondition, NotFound
from shared.weights.client import load_version
from shared.weights.formats import TENSOR_SUFFIX, pickle_bearing

log = logging.getLogger(__name__)


def nonfinite_tensors(files_dir: Path) -> tuple[list[str], int]:
    """Names of tensors holding NaN/Inf in every safetensors file under `files_dir`, and the tensor count.
    A file that is not valid safetensors counts as bad too (`<file>: unreadable (...)`): it cannot be
    served either, and an uploader must not turn it into an internal error of the gate."""
    # heavy: torch, only when an evaluation runs (the registry imports this module)
    import torch

    bad, total = [], 0
    # a pickle stored before uploads refused them is not checked (it would run code), so it fails; and a
    # version with no tensor file at all fails too: "0 of 0 tensors" once passed a NaN `pytorch_model.bin`
    bad += [f"{p.relative_to(files_dir)}: not safetensors (refused)"
            for p in sorted(files_dir.rglob("*")) if p.is_file() and pickle_bearing(p.name)]
    tensor_files = sorted(files_dir.rglob(f"*{TENSOR_SUFFIX}"))
    if not tensor_files:
        bad.append(f"no {TENSOR_SUFFIX} file: nothing to check or serve")
    for path in tensor_files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    total += 1
                    t = f.get_tensor(name)
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        bad.append(f"{path.name}:{name}")
        except (SafetensorError, OSError, ValueError) as e:
            bad.append(f"{path.name}: unreadable ({str(e)[:200]})")
    return bad, total


class CannotLoad(Exception):
    """A version's files are not a model this service can load (the cause is chained)."""


def greedy_answers(model: Any, tok: Any, chats: Sequence[list[dict[str, str]]], *, max_new_tokens: int,
                   batch_size: int, desc: str = "eval gate") -> list[Any]:
    """Greedy answers (`Sample`s), batched: one batch of all prompts runs each decode step (which reads every
    weight once) once instead of once per batch; when they do not fit in one batch, prompts of similar
    length share one (less left padding). Answers do not depend on the batching. The decode loop computes
    the last position's logits only (shared/decoding/forward.py)."""
    # heavy: torch, only when an evaluation runs
    from shared.decoding.generation import generate

    prompts = [encode_chat(tok, c).ids for c in chats]    # the ids inference would serve
    order = sorted(range(len(prompts)), key=lambda j: len(prompts[j]))
    out: list[Any] = [None] * len(prompts)
    # a bar on a terminal only (`apprentice serve weights` in one; never in a log file): shared/progress.py
    with progress(total=len(prompts), desc=desc, unit="prompt", leave=False) as bar:
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            for j, smp in zip(idx, generate(model, tok, [prompts[j] for j in idx], max_new_tokens=max_new_tokens,
                                            temperature=0.0), strict=True):
                out[j] = smp[0]
            bar.update(len(idx))
    return out


def score_model(model: Any, tok: Any, heldout: LoadedHeldout, ood: OodSet, *, max_new_tokens: int,
                batch_size: int) -> ModelScores:
    """One model on both sets: greedy answers graded by rules, reference answers scored by likelihood."""
    # heavy: torch, only when an evaluation runs (the registry imports this module)
    import torch

    from shared.decoding.logprobs import sequence_logprobs  # heavy: torch

    def greedy(chats: list[list[dict[str, str]]]) -> list[Any]:
        return greedy_answers(model, tok, chats, max_new_tokens=max_new_tokens, batch_size=batch_size)

    def rule_score(specs: Sequence[Any], text: str, reference: dict[str, Any] | None) -> float | None:
        """Weighted mean of the values of the rules that have signal; None when none has."""
        results = [(s.weight, grade_rule(s, text, reference=reference)) for s in specs]
        weighted = [(w, r.value) for w, r in results if r.has_signal]
        total_w = sum(w for w, _ in weighted)
        return sum(w * v for w, v in weighted) / total_w if weighted and total_w > 0 else None

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else math.nan

    # 1) one greedy pass over every prompt that needs an answer: held-out items + OOD items with a check
    held = heldout.spec.items
    checked = [it for it in ood.items if it.check is not None]
    samples = greedy([it.chat(heldout.spec.system) for it in held] + [it.chat(ood.system) for it in checked])
    held_samples, ood_samples = samples[:len(held)], samples[len(held):]

    # 2) held-out: rule score per item, mean over the items with signal
    item_scores = [x for item, specs, smp in zip(held, heldout.graders, held_samples, strict=True)
                   if (x := rule_score(specs, smp.text, item.reference)) is not None]
    checks = [x for it, smp in zip(checked, ood_samples, strict=True)
              if (x := rule_score([parse_rule_spec({"name": "ood", **(it.check or {})})], smp.text, None)) is not None]

    # 3) OOD likelihood of reference answers (teacher-forced, T=1), token-weighted
    logp_sum, n_tokens = 0.0, 0
    with torch.no_grad():
        for it in ood.items:
            if it.answer is None:
                continue
            prompt_ids = encode_chat(tok, it.chat(ood.system)).ids
            answer_ids = encode_text(tok, it.answer)   # an answer is content: `<|im_end|>` in it stays text
            lp = sequence_logprobs(model, prompt_ids, answer_ids)
            logp_sum += float(lp.sum())
            n_tokens += len(answer_ids)
    loglik = logp_sum / n_tokens if n_tokens else math.nan

    # 4) degeneration: repetition in every greedy answer the model gave above
    eos = {tok.eos_token_id}
    reps = [repetition_rate([t for t in s.token_ids if t not in eos]) for s in samples]
    return ModelScores(mean(item_scores), len(item_scores), loglik, mean(reps), mean(checks))


SCORING_VERSION = "2"  # part of every score-cache key: change it when score_model measures differently


KNOWLEDGE_READY_WAIT_S = 15.0
"""How long a gate run right after start waits for the knowledge view to catch up with its topic; past it
the items known so far are checked (the results are informational) and a warning is logged."""


class Evaluator:
    def __init__(self, store: WeightStore, settings: WeightsSettings, knowledge: KnowledgeView | None = None) -> None:
        self.store = store
        self.settings = settings
        self.knowledge = knowledge
        self.heldout = load_heldout(settings.eval_set)
        self.ood, self._ood_digest = load_ood(settings.ood_set)
        for warning in coarse_limits(len(self.heldout.spec.items), sum(it.check is not None for it in self.ood.items),
                                     settings.gate.heldout_max_drop, settings.gate.ood_max_rule_drop):
            log.warning("eval gate: %s", warning)
        self.workdir = settings.store_root / "work"
        self.cache_dir = settings.store_root / "eval-cache"
        self._lock = threading.Lock()
        self._baseline_cache: dict[str, ModelScores] = {}
        self._tok: Any = None
        self.scored = 0  # models scored (not served from the cache) by this evaluator

    def _key(self, m: weights_pb2.Manifest) -> str:
        """What a version's scores depend on: its bytes (and its base's, for LoRA), the eval sets and the
        generation settings. Greedy scoring is deterministic, so equal keys mean equal scores."""
        s = self.settings
        parts = [SCORING_VERSION, m.model, m.version, ",".join(f.sha256 for f in m.files), self._base_fingerprint(m),
                 self.heldout.digest, self._ood_digest, str(s.eval_max_new_tokens), str(s.eval_batch_size)]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    def _base_fingerprint(self, m: weights_pb2.Manifest) -> str:
        """The local base model's files (names, sizes, mtimes) for `base` and LoRA-on-base versions; the
        base version's file hashes for a LoRA on stored full weights."""
        if m.version != BASE and m.kind != "lora":
            return ""
        if m.version != BASE and m.base_version not in ("", BASE):
            return ",".join(f.sha256 for f in self.store.get(m.model, m.base_version).files)

        where = Path(resolve_model_dir(m.base_model or m.model))
        if not where.is_dir():
            return str(where)  # a hub id: its cache is immutable per revision
        return ",".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(where.iterdir())
                        if p.is_file())

    def _cached_scores(self, key: str) -> ModelScores | None:
        """Scores from memory, else from the store's eval cache (they survive a restart of the service)."""
        if key in self._baseline_cache:
            return self._baseline_cache[key]
        try:
            raw = json.loads((self.cache_dir / f"{key}.json").read_text())
            scores = ModelScores(**raw)
        except (OSError, ValueError, TypeError):
            return None  # absent or unreadable: score again
        self._baseline_cache[key] = scores
        return scores

    def _remember(self, key: str, scores: ModelScores) -> None:
        self._baseline_cache[key] = scores
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_dir / f".{key}.{uuid.uuid4().hex}.tmp"
            tmp.write_text(json.dumps(asdict(scores)))
            os.replace(tmp, self.cache_dir / f"{key}.json")
        except OSError:
            log.warning("could not write the eval score cache", exc_info=True)

    def _tokenizer(self, model_name: str) -> Any:
        if self._tok is None:
            self._tok = load_tokenizer(model_name)
        return self._tok

    def _load(self, m: weights_pb2.Manifest, work: Path) -> Any:
        name = m.base_model or m.model
        if m.version == BASE:
            return load_model(name)[0]
        files = self.store.materialise(m, work / m.version)
        base = None
        if m.kind == "lora" and m.base_version not in ("", BASE):
            base = self._load(self.store.get(m.model, m.base_version), work)
        return load_version(m, files, name, base_model=base)

    # --- the model seam (tests replace these three to run the gate without a model) -------------------
    def load_version(self, m: weights_pb2.Manifest, work: Path) -> Any:
        """The version as a model ready to generate; CannotLoad when its files are not a loadable model."""
        try:
            return self._load(m, work)
        except (ValueError, OSError, KeyError) as e:
            raise CannotLoad(f"{type(e).__name__}: {str(e)[:300]}") from e

    def score_loaded(self, model: Any, m: weights_pb2.Manifest) -> ModelScores:
        """The loaded model's scores on the held-out and OOD sets."""
        s = self.settings
        return score_model(model, self._tokenizer(m.base_model or m.model), self.heldout, self.ood,
                           max_new_tokens=s.eval_max_new_tokens, batch_size=s.eval_batch_size)

    def answer(self, model: Any, m: weights_pb2.Manifest, chats: Sequence[list[dict[str, str]]]) -> list[str]:
        """Greedy answers of the loaded model, batched like the held-out set's."""
        s = self.settings
        return [smp.text for smp in greedy_answers(model, self._tokenizer(m.base_model or m.model), chats,
                                                   max_new_tokens=s.eval_max_new_tokens,
                                                   batch_size=s.eval_batch_size, desc="knowledge checks")]

    # --- baselines --------------------------------------------------------------------------------------
    def baseline_for(self, m: weights_pb2.Manifest) -> str:
        """The parent: the version the candidate's tenant is served now (its slot, the operator slot, base)."""
        return self.store.state(m.model).serving_for(m.tenant)

    def reference_for(self, m: weights_pb2.Manifest) -> str:
        """The reference the cumulative limits hold the candidate to (settings; base by default)."""
        return self.settings.reference_for(m.tenant)

    def _baseline_scores(self, m: weights_pb2.Manifest, version: str, role: str, work: Path) -> ModelScores:
        """Scores of the parent or reference `version`, from the cache when it has them (the parent was
        scored as a candidate; the reference once per eval sets and settings, then read from the cache)."""
        try:
            bm = self.store.get(m.model, version)
        except NotFound as e:
            raise FailedPrecondition(
                f"{m.model} {version}, the {role} to compare against, is not stored"
                + (" (set APPRENTICE_WEIGHTS_REFERENCE_VERSION / _TENANT_REFERENCE_VERSIONS to a stored version, "
                   "or base)" if role == REFERENCE else "")) from e
        key = self._key(bm)
        scores = self._cached_scores(key)
        if scores is None:
            try:
                model = self.load_version(bm, work)
            except CannotLoad as e:
                raise FailedPrecondition(
                    f"{bm.model} {bm.version}, the {role} to compare against, cannot be loaded ({e}); "
                    + ("roll back to a loadable version first" if role == PARENT else "choose another reference")
                ) from e
            self.scored += 1
            scores = self.score_loaded(model, bm)
            del model
            self._remember(key, scores)
        return scores

    def evaluate(self, m: weights_pb2.Manifest, extra_metrics: Mapping[str, float] | None = None,
                 baseline: str | None = None) -> weights_pb2.Manifest:
        """Run the gate on `m`, record results and verdict in its manifest, and return the new manifest."""
        with self._lock:
            current = self.store.get(m.model, m.version)
            if current.status != weights_pb2.VERSION_STATUS_CANDIDATE:
                return current  # evaluated meanwhile (a redelivered event, or Promote raced the consumer)
            started = time.monotonic()
            s = self.settings
            baseline = baseline or self.baseline_for(m)
            reference = self.reference_for(m)
            work = self.workdir / uuid.uuid4().hex
            EVALS_RUNNING.inc()
            try:
                files = self.store.materialise(m, work / f"{m.version}.check")
                bad, total = nonfinite_tensors(files)
                results = [integrity_result(bad, total),
                           hacking_result(hacking_fraction(m, extra_metrics), s.gate.max_hacking_fraction)]
                if not bad:  # a NaN model cannot be scored meaningfully; the integrity result already blocks
                    results += self._compare(m, baseline, reference, work)
            finally:
                EVALS_RUNNING.dec()
                shutil.rmtree(work, ignore_errors=True)
            passed, reason = verdict(results)
            reason += f" (parent {baseline}, reference {reference}, {time.monotonic() - started:.1f}s)"

            def record(x: weights_pb2.Manifest) -> None:
                del x.eval_results[:]
                x.eval_results.extend(results)
                for k, v in (extra_metrics or {}).items():
                    if k not in x.train_metrics:
                        x.train_metrics[k] = v
                x.status = weights_pb2.VERSION_STATUS_APPROVED if passed else weights_pb2.VERSION_STATUS_REJECTED
                x.status_reason = reason

            out = self.store.update(m.model, m.version, record)
            EVAL_SECONDS.observe(time.monotonic() - started)
            EVALS.labels("approved" if passed else "rejected").inc()
            log.log(logging.INFO if passed else logging.WARNING, "eval gate: %s %s %s", m.model, m.version, reason)
            return out

    def check_integrity(self, m: weights_pb2.Manifest) -> weights_pb2.Manifest:
        """Only the integrity part of the gate (seconds, no scoring): record its result in the manifest and
        mark the version REJECTED when a tensor holds NaN/Inf. What a forced promote of a version the gate
        never saw still runs; the manifest is returned unchanged when the check already ran."""
        if integrity_of(m) is not None or m.version == BASE:
            return m
        work = self.workdir / uuid.uuid4().hex
        try:
            bad, total = nonfinite_tensors(self.store.materialise(m, work / f"{m.version}.check"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result = integrity_result(bad, total)

        def record(x: weights_pb2.Manifest) -> None:
            if integrity_of(x) is None:
                x.eval_results.append(result)
            if bad:
                x.status = weights_pb2.VERSION_STATUS_REJECTED
                x.status_reason = f"blocked: integrity/nonfinite_tensors {result.detail}"

        return self.store.update(m.model, m.version, record)

    def _compare(self, m: weights_pb2.Manifest, parent: str, reference: str,
                 work: Path) -> list[weights_pb2.EvalResult]:
        """Regression checks against the parent (per-step limits) and the reference (cumulative limits),
        then the informational knowledge checks on the same loaded candidate."""
        s = self.settings
        # baselines first (from the cache, else scored and released), so one model is in memory at a time
        parent_scores = self._baseline_scores(m, parent, PARENT, work)
        ref_scores = parent_scores if reference == parent else (
            None if reference == m.version else self._baseline_scores(m, reference, REFERENCE, work))
        try:
            loaded = self.load_version(m, work)
        except CannotLoad as e:
            # Files that are not a model this service can load (a config.json without model_type, weights
            # of another shape): the gate's verdict is "rejected", not an internal error of Promote.
            return [weights_pb2.EvalResult(suite="integrity", metric="loadable", candidate=0.0, baseline=1.0,
                                           threshold=1.0, passed=False, detail=f"cannot be loaded: {e}")]
        self.scored += 1
        cand = self.score_loaded(loaded, m)
        self._remember(self._key(m), cand)  # it may be the parent of the next candidate
        if ref_scores is None:              # the reference is this version itself (an operator's choice)
            ref_scores = cand
        heldout = f"{self.heldout.spec.name}: {cand.heldout_items} of {len(self.heldout.spec.items)} items with signal"
        step = Limits(s.gate.heldout_max_drop, s.gate.ood_max_loglik_drop, s.gate.ood_max_rule_drop,
                      s.gate.ood_max_repetition_rise)
        total = Limits(s.drift.heldout_max_drop, s.drift.ood_max_loglik_drop, s.drift.ood_max_rule_drop,
                       s.drift.ood_max_repetition_rise)
        results = regression_results(cand, parent_scores, step, baseline_version=parent, comparison=PARENT,
                                     heldout_detail=heldout, ood_name=self.ood.name)
        results += regression_results(cand, ref_scores, total, baseline_version=reference, comparison=REFERENCE,
                                      heldout_detail=heldout, ood_name=self.ood.name)
        return results + self._knowledge_checks(m, loaded, parent)

    def _knowledge_checks(self, m: weights_pb2.Manifest, model: Any, parent: str) -> list[weights_pb2.EvalResult]:
        """One informational result per knowledge item of the candidate's tenant (knowledge.py): its
        questions asked greedily without any knowledge in context, as the held-out set is asked (the
        task's system prompt when the held-out set has one), all items' questions in one batched pass."""
        limit = self.settings.knowledge_max_items
        if self.knowledge is None or limit <= 0 or not m.tenant:
            return []
        if not self.knowledge.wait_ready(KNOWLEDGE_READY_WAIT_S):
            log.warning("eval gate: the knowledge view has not caught up with its topic after %.0fs; checking "
                        "the items known so far", KNOWLEDGE_READY_WAIT_S)
        items = self.knowledge.items_for(m.tenant, limit)
        if not items:
            return []
        system = self.heldout.spec.system
        chats = [[*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": q}]
                 for it in items for q in it.questions]
        answers = iter(self.answer(model, m, chats))
        before = self._parent_shares(m, parent)
        return [knowledge_result(it.metric, [next(answers) for _ in it.questions], it.answer_terms,
                                 before.get(it.metric, math.nan)) for it in items]

    def _parent_shares(self, m: weights_pb2.Manifest, parent: str) -> dict[str, float]:
        """The parent's knowledge results by metric, as recorded when it was gated: the per-item baseline
        at no cost (NaN for base, which is never gated, and for items it was not asked about)."""
        if parent == BASE:
            return {}
        try:
            pm = self.store.get(m.model, parent)
        except NotFound:
            return {}
        return {r.metric: r.candidate for r in pm.eval_results if r.suite == KNOWLEDGE}

