"""Gate arithmetic against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from services.weights.gate import (
    coarse_limits,
    compare,
    hacking_fraction,
    hacking_result,
    integrity_result,
    verdict,
)
from shared.decoding.repetition import repetition_rate
from shared.proto.apprentice.v1 import weights_pb2


def test_compare_higher_is_better() -> None:
    assert compare("s", "m", 0.55, 0.6, 0.1).passed          # -0.05 within the 0.1 limit
    r = compare("s", "m", 0.45, 0.6, 0.1)                    # -0.15
    assert not r.passed and "-0.1500" in r.detail and r.threshold == 0.1
    assert compare("s", "m", 0.9, 0.6, 0.0).passed


def test_compare_lower_is_better() -> None:
    assert compare("ood", "repetition", 0.3, 0.2, 0.25, higher_is_better=False).passed   # rose 0.1
    assert not compare("ood", "repetition", 0.5, 0.2, 0.25, higher_is_better=False).passed  # rose 0.3


def test_compare_non_finite() -> None:
    assert not compare("s", "m", math.nan, -3.0, 1.0).passed
    assert not compare("s", "m", -math.inf, -3.0, 1.0).passed
    assert compare("s", "m", math.nan, math.nan, 1.0).passed   # neither had signal
    assert compare("s", "m", 0.2, math.nan, 1.0).passed


def test_hacking_fraction_sources() -> None:
    m = weights_pb2.Manifest()
    assert hacking_fraction(m) is None
    assert hacking_fraction(m, {"hacking_flag_fraction": 0.3}) == 0.3
    m.training_metadata["hacking_flag_fraction"] = "0.25"
    assert hacking_fraction(m) == 0.25
    m.train_metrics["hacking_flag_fraction"] = 0.05
    assert hacking_fraction(m) == 0.05
    m2 = weights_pb2.Manifest()
    m2.training_metadata["hacking_flag_fraction"] = "lots"
    assert not hacking_result(hacking_fraction(m2), 0.2).passed
    assert hacking_result(0.2, 0.2).passed and not hacking_result(0.21, 0.2).passed
    assert hacking_result(None, 0.2).passed


def test_verdict_names_failures() -> None:
    ok, reason = verdict([integrity_result([], 10), compare("heldout", "rule_score", 0.1, 0.5, 0.1)])
    assert not ok and reason.startswith("blocked: heldout/rule_score")
    ok, reason = verdict([integrity_result([], 10)])
    assert ok and "integrity/nonfinite_tensors" in reason
    assert not integrity_result(["model.safetensors:w"], 10).passed


@pytest.mark.parametrize(("ids", "expected"), [
    ([1, 2, 3, 1, 2, 3], 0.25),      # 3-grams 123 231 312 123 -> 1 - 3/4
    ([5, 5, 5, 5, 5], 2 / 3),        # 555 x3 -> 1 - 1/3
    ([1, 2, 3, 4], 0.0),
    ([1, 2], 0.0),
])
def test_repetition_rate(ids: list[int], expected: float) -> None:
    assert repetition_rate(ids) == pytest.approx(expected)


def test_coarse_limits_warn_when_one_answer_exceeds_the_limit() -> None:
    # six OOD questions under a 0.1 limit: one changed answer is a 0.17 drop
    (warning,) = coarse_limits(15, 6, 0.1, 0.1)
    assert warning.startswith("6 OOD questions with checks") and "0.17" in warning and "APPRENTICE_WEIGHTS_GATE__OOD_MAX_RULE_DROP" in warning
    assert coarse_limits(15, 46, 0.1, 0.1) == []          # 1/46 = 0.022: five answers must change
    assert coarse_limits(0, 0, 0.1, 0.1) == []            # a metric without items is not scored, not coarse
    (held,) = coarse_limits(5, 46, 0.1, 0.1)
    assert held.startswith("5 held-out items") and "GATE__HELDOUT_MAX_DROP=0.1" in held
    assert coarse_limits(10, 10, 0.1, 0.1) == []          # exactly one step per limit is resolvable
