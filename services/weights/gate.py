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
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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


def compare(suite: str, metric: str, candidate: float, baseline: float, limit: float, *,
            higher_is_better: bool = True, detail: str = "") -> weights_pb2.EvalResult:
    """Regression check. Higher-is-better metrics fail when candidate < baseline - limit; lower-is-better
    ones when candidate > baseline + limit. A non-finite candidate fails unless the baseline had no signal
    either (both NaN: the set cannot judge this model, e.g. no rule applied)."""
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
                                  threshold=limit, passed=passed, detail="; ".join(x for x in (why, detail) if x))


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


def verdict(results: list[weights_pb2.EvalResult]) -> tuple[bool, str]:
    failed = [r for r in results if not r.passed]
    if not failed:
        return True, "passed the eval gate: " + ", ".join(f"{r.suite}/{r.metric}" for r in results)
    return False, "blocked: " + "; ".join(f"{r.suite}/{r.metric} {r.detail}" for r in failed)


def coarse_limits(heldout_items: int, ood_checked_items: int, heldout_max_drop: float,
                  ood_max_rule_drop: float) -> list[str]:
    """Warnings for rule-score limits finer than their set can resolve. A mean over n pass/fail items
    moves in steps of 1/n: with 1/n > limit a single changed answer blocks every candidate, so the gate
    refuses on one answer's noise (a task file's six OOD questions under the 0.1 default did exactly
    that to every honest GRPO candidate of a run; the packaged general questions exist for this)."""
    out = []
    for what, n, limit, setting in (("held-out items", heldout_items, heldout_max_drop, "heldout_max_drop"),
                                    ("OOD questions with checks", ood_checked_items, ood_max_rule_drop,
                                     "ood_max_rule_drop")):
        if n and 1.0 / n > limit:
            out.append(f"{n} {what}: one changed answer moves the score by {1.0 / n:.2f}, more than "
                       f"{setting}={limit:g}, so any single change blocks a candidate; add items or raise the limit")
    return out
