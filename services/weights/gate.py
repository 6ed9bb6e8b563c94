"""Candidate and baseline scores --> `EvalResult`s and a verdict (pure; no model, no network).

Checks, each recorded as one `EvalResult` in the manifest:
- integrity / nonfinite_tensors: any NaN or Inf in the checkpoint's tensors blocks it outright;
- training_data / hacking_flag_fraction: the share of the producing batch that the grader flagged for
  reward hacking (the trainer writes it as `hacking_flag_fraction` into the upload's train_metrics, or
  training_metadata, or the CheckpointPublished metrics); above the limit blocks;
- heldout / rule_score: mean rule-grader score on the held-out set; blocks if it drops by more than the limit;
- ood / ref_loglik: mean per-token log-likelihood of general reference answers; blocks on a drop;
- ood / repetition: share of repeated 3-grams in the candidate's greedy answers (held-out and OOD
  questions); blocks on a rise;
- ood / rule_score: rule checks on general questions (e.g. "capital of France" contains Paris); blocks on a drop.

Each of the four regression checks is recorded twice (`EvalResult.comparison`): against the version the
candidate replaces ("parent", the per-step limit) and against a fixed reference, the base model or an
operator's choice ("reference", a cumulative limit). Per-step limits alone let drift add up: OOD repetition
went 0.017 -> 0.042 -> 0.159 over two promotions with every step inside its limit. A failure of either blocks.

- knowledge / item:<key>:<item_id>@<revision>: whether the candidate answers an approved knowledge item's
  questions without the item in context (the weights hold it). Informational: `verdict` never counts suite
  `knowledge`, because whether an item still needs the prompt context is the knowledge service's question,
  not a reason to withhold better weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.knowledge.terms import answer_holds
from shared.proto.apprentice.v1 import weights_pb2

HACKING_KEY = "hacking_flag_fraction"
"""The key under which the trainer reports the share of its batch flagged (and quarantined) for reward hacking."""


def hacking_fraction(m: weights_pb2.Manifest, extra: Mapping[str, float] | None = None) -> float | None:
    """The producing batch's reward-hacking flag share, wherever the trainer put it; None when absent."""
    if HACKING_KEY in m.train_metrics:
        return float(m.train_metrics[HACKING_KEY])
    if extra and HACKING_KEY in extra:
        return float(extra[HACKING_KEY])
    if HACKING_KEY in m.training_metadata:
        try:
            return float(m.training_metadata[HACKING_KEY])
        except ValueError:
            return math.nan  # unreadable: treated as failing, a wrong value must not pass silently
    return None


PARENT = "parent"
"""`EvalResult.comparison` of a check against the version the candidate replaces (the per-step limit)."""
REFERENCE = "reference"
"""`EvalResult.comparison` of a check against the fixed reference (base or pinned; the cumulative limit)."""

KNOWLEDGE = "knowledge"
INFORMATIONAL_SUITES = frozenset({KNOWLEDGE})
"""Suites recorded in the manifest that the verdict never counts (see `verdict`)."""

KNOWLEDGE_THRESHOLD = 1.0
"""An item is held only when every question asked about it was answered (share 1.0)."""
FAILED_ANSWER_CHARS = 120


@dataclass(frozen=True)
class ModelScores:
    """One model's scores on the eval sets (evaluator.score_model); cached per version."""

    heldout: float      # mean rule score over items with signal; NaN when none had signal
    heldout_items: int  # items with signal
    loglik: float       # mean per-token log-likelihood of the OOD reference answers; NaN without any
    repetition: float   # mean share of repeated 3-grams in all its greedy answers (held-out + OOD checks)
    ood_rule: float     # mean rule score of greedy answers on OOD items with a check; NaN without any


@dataclass(frozen=True)
class Limits:
    """Largest allowed regression per metric: per step (parent) or cumulative (reference)."""

    heldout: float
    loglik: float
    rule: float
    repetition: float


def compare(suite: str, metric: str, candidate: float, baseline: float, limit: float, *,
            higher_is_better: bool = True, detail: str = "", baseline_version: str = "",
            comparison: str = "") -> weights_pb2.EvalResult:
    """Regression check. Higher-is-better metrics fail when candidate < baseline - limit; lower-is-better
    ones when candidate > baseline + limit. A non-finite candidate fails unless the baseline had no signal
    either (both NaN: the set cannot judge this model, e.g. no rule applied). `baseline_version` and
    `comparison` say what the baseline was measured on (recorded so both comparisons can be told apart)."""
    c_ok, b_ok = math.isfinite(candidate), math.isfinite(baseline)
    if not c_ok and not b_ok:
        passed, why = True, "no signal for either model"
    elif not c_ok:
        passed, why = False, "candidate score is not finite"
    elif not b_ok:
        passed, why = True, "baseline had no signal"
    else:
        delta = candidate - baseline if higher_is_better else baseline - candidate
        passed = delta >= -limit
        why = f"{'+' if delta >= 0 else ''}{delta:.4f} ({'better' if delta >= 0 else 'worse'}; limit -{limit:g})"
    return weights_pb2.EvalResult(suite=suite, metric=metric, candidate=candidate, baseline=baseline,
                                  threshold=limit, passed=passed, detail="; ".join(x for x in (why, detail) if x),
                                  baseline_version=baseline_version, comparison=comparison)


def regression_results(cand: ModelScores, base: ModelScores, limits: Limits, *, baseline_version: str,
                       comparison: str, heldout_detail: str = "", ood_name: str = "ood") -> list[weights_pb2.EvalResult]:
    """The four regression checks of `cand` against one baseline's scores. The evaluator calls it twice,
    with the parent's scores and per-step limits and with the reference's scores and cumulative limits."""
    since = f"cumulative since {baseline_version}" if comparison == REFERENCE else f"vs {baseline_version}"

    def check(suite: str, metric: str, c: float, b: float, limit: float, detail: str,
              higher_is_better: bool = True) -> weights_pb2.EvalResult:
        return compare(suite, metric, c, b, limit, higher_is_better=higher_is_better, detail=detail,
                       baseline_version=baseline_version, comparison=comparison)

    return [
        check("heldout", "rule_score", cand.heldout, base.heldout, limits.heldout,
              "; ".join(x for x in (heldout_detail, since) if x)),
        check("ood", "ref_loglik", cand.loglik, base.loglik, limits.loglik,
              f"{ood_name}: nats/token of reference answers; {since}"),
        check("ood", "repetition", cand.repetition, base.repetition, limits.repetition,
              f"share of repeated 3-grams in all greedy answers; {since}", higher_is_better=False),
        check("ood", "rule_score", cand.ood_rule, base.ood_rule, limits.rule,
              f"{ood_name}: general questions with rule checks, greedy; {since}"),
    ]


def integrity_result(bad: list[str], total: int) -> weights_pb2.EvalResult:
    detail = f"{len(bad)} of {total} tensors hold NaN/Inf" + (f": {', '.join(bad[:5])}" if bad else "")
    return weights_pb2.EvalResult(suite="integrity", metric="nonfinite_tensors", candidate=float(len(bad)),
                                  baseline=0.0, threshold=0.0, passed=not bad, detail=detail)


def integrity_of(m: weights_pb2.Manifest) -> weights_pb2.EvalResult | None:
    """The manifest's integrity result, None when the check has not run on this version.

    Unlike every other check, a failed integrity check cannot be overridden with `force`: a model with
    NaN/Inf weights answers nothing useful to anyone, so no operator reason makes serving it right."""
    return next((r for r in m.eval_results if r.suite == "integrity" and r.metric == "nonfinite_tensors"), None)


def hacking_result(fraction: float | None, limit: float) -> weights_pb2.EvalResult:
    if fraction is None:
        return weights_pb2.EvalResult(suite="training_data", metric="hacking_flag_fraction", candidate=0.0,
                                      threshold=limit, passed=True, detail="not reported by the trainer")
    passed = math.isfinite(fraction) and fraction <= limit
    return weights_pb2.EvalResult(
        suite="training_data", metric="hacking_flag_fraction", candidate=fraction, threshold=limit, passed=passed,
        detail=f"{fraction:.1%} of the producing batch flagged for reward hacking (limit {limit:.0%})")


def knowledge_result(metric: str, answers: Sequence[str], terms: Sequence[str],
                     baseline: float = math.nan) -> weights_pb2.EvalResult:
    """One knowledge item's check: `answers` are the candidate's greedy answers to the item's questions,
    asked without the item in context; each passes when it holds the item's answer terms
    (shared/knowledge/terms.py). Held = every answer passes. `baseline` is the share the replaced version
    scored on the same item revision, NaN when unknown. Informational: `verdict` ignores this suite."""
    ok = [answer_holds(a, terms) for a in answers]
    share = sum(ok) / len(ok) if ok else 0.0
    held = bool(ok) and all(ok)
    if held:
        detail = "held"
    elif not ok:
        detail = "not held: no question asked"
    else:
        first = " ".join(answers[ok.index(False)].split())
        detail = f"not held: {first[:FAILED_ANSWER_CHARS]}"
    return weights_pb2.EvalResult(suite=KNOWLEDGE, metric=metric, candidate=share, baseline=baseline,
                                  threshold=KNOWLEDGE_THRESHOLD, passed=held, detail=detail)


def check_name(r: weights_pb2.EvalResult) -> str:
    """`suite/metric`, with the comparison for regression checks ("ood/repetition vs reference base")."""
    name = f"{r.suite}/{r.metric}"
    return f"{name} vs {r.comparison} {r.baseline_version or '?'}" if r.comparison else name


def verdict(results: list[weights_pb2.EvalResult]) -> tuple[bool, str]:
    """Pass when every blocking result passed; the reason names each failed check (with its comparison).

    Suites in INFORMATIONAL_SUITES (the per-item knowledge checks) are left out of the decision on
    purpose and only summarised: they report what the weights hold, for the knowledge service to act on;
    an item the candidate does not hold yet is no regression (it still serves from the prompt context)."""
    blocking = [r for r in results if r.suite not in INFORMATIONAL_SUITES]
    informational = [r for r in results if r.suite in INFORMATIONAL_SUITES]
    note = ""
    if informational:
        held = sum(r.passed for r in informational)
        note = f"; knowledge (informational, never blocks): {held} of {len(informational)} items held"
    failed = [r for r in blocking if not r.passed]
    if not failed:
        names = ", ".join(dict.fromkeys(f"{r.suite}/{r.metric}" for r in blocking))
        against = ", ".join(dict.fromkeys(f"{r.comparison} {r.baseline_version}" for r in blocking if r.comparison))
        return True, "passed the eval gate: " + names + (f" (vs {against})" if against else "") + note
    return False, "blocked: " + "; ".join(f"{check_name(r)}{':' if r.comparison else ''} {r.detail}"
                                          for r in failed) + note


def coarse_limits(heldout_items: int, ood_checked_items: int, heldout_max_drop: float,
                  ood_max_rule_drop: float) -> list[str]:
    """Warnings for rule-score limits finer than their set can resolve. A mean over n pass/fail items
    moves in steps of 1/n: with 1/n > limit a single changed answer blocks every candidate, so the gate
    refuses on one answer's noise (a task file's six OOD questions under the 0.1 default did exactly
    that to every honest GRPO candidate of a run; the packaged general questions exist for this)."""
    out = []
    for what, n, limit, setting in (("held-out items", heldout_items, heldout_max_drop,
                                     "APPRENTICE_WEIGHTS_GATE__HELDOUT_MAX_DROP"),
                                    ("OOD questions with checks", ood_checked_items, ood_max_rule_drop,
                                     "APPRENTICE_WEIGHTS_GATE__OOD_MAX_RULE_DROP")):
        if n and 1.0 / n > limit:
            out.append(f"{n} {what}: one changed answer moves the score by {1.0 / n:.2f}, more than "
                       f"{setting}={limit:g}, so any single change blocks a candidate; add items or raise the limit")
    return out
