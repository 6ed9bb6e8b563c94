"""Cumulative drift: every regression check compares a candidate with the version it replaces (per-step
limit) and with a fixed reference (cumulative limit), so small steps cannot add up to a large regression.

Pure: the evaluator's model seam (`load_version`, `score_loaded`) is replaced by scores per version, so the
gate's bookkeeping (parent, reference, cache, manifest, verdict, orders) runs for real without a model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from services.weights.evaluator import Evaluator
from services.weights.gate import PARENT, REFERENCE, Limits, ModelScores, regression_results, verdict
from services.weights.orders import OrderDesk
from services.weights.retention import versions_to_keep
from services.weights.settings import LocalStoreSettings, WeightsSettings
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import FailedPrecondition
from tests.helpers.weights_files import tensor_file

from .conftest import UploadFn
from .test_orders import Recorder

S = weights_pb2


def scores(repetition: float, heldout: float = 0.6, loglik: float = -2.4, ood_rule: float = 0.5) -> ModelScores:
    return ModelScores(heldout=heldout, heldout_items=10, loglik=loglik, repetition=repetition, ood_rule=ood_rule)


class ScriptedEvaluator(Evaluator):
    """The real gate with each version's scores given by the test instead of measured on a model."""

    def __init__(self, store: WeightStore, settings: WeightsSettings, table: dict[str, ModelScores]) -> None:
        super().__init__(store, settings)
        self.table = table
        self.scored_versions: list[str] = []

    def _base_fingerprint(self, m: weights_pb2.Manifest) -> str:
        return "scripted"                           # model "m" has no local files to fingerprint

    def load_version(self, m: weights_pb2.Manifest, work: Path) -> Any:
        return m.version

    def score_loaded(self, model: Any, m: weights_pb2.Manifest) -> ModelScores:
        self.scored_versions.append(m.version)
        return self.table[m.version]


def by_comparison(m: weights_pb2.Manifest) -> dict[tuple[str, str], weights_pb2.EvalResult]:
    return {(f"{r.suite}/{r.metric}", r.comparison): r for r in m.eval_results}


REGRESSIONS = ("heldout/rule_score", "ood/ref_loglik", "ood/repetition", "ood/rule_score")


def test_small_steps_that_add_up_are_refused_against_the_base(store: WeightStore, upload: UploadFn) -> None:
    """OOD repetition 0.017 -> 0.042 -> 0.09 -> 0.159: every step rises far less than the per-step 0.25,
    but the third candidate is 0.142 above the base, past the cumulative 0.1; it is refused, and its
    manifest holds both comparisons of every regression check."""
    table = {"base": scores(0.017), "v1": scores(0.042), "v2": scores(0.09), "v3": scores(0.159)}
    settings = WeightsSettings(store=LocalStoreSettings(dir=store.root))
    assert (settings.gate.ood_max_repetition_rise, settings.drift.ood_max_repetition_rise) == (0.25, 0.1)
    ev = ScriptedEvaluator(store, settings, table)
    desk = OrderDesk(store, Recorder(), gate=ev.evaluate)
    for data in (tensor_file(1), tensor_file(2), tensor_file(3)):
        upload({"model.safetensors": data})

    for version, parent in (("v1", "base"), ("v2", "v1")):
        m = ev.evaluate(store.get("m", version))
        assert m.status == S.VERSION_STATUS_APPROVED, m.status_reason
        r = by_comparison(m)
        assert r[("ood/repetition", PARENT)].baseline_version == parent
        assert r[("ood/repetition", REFERENCE)].baseline_version == "base"
        desk.promote("m", version)

    m = ev.evaluate(store.get("m", "v3"))
    assert m.status == S.VERSION_STATUS_REJECTED
    r = by_comparison(m)
    assert set(r) == {*((name, c) for name in REGRESSIONS for c in (PARENT, REFERENCE)),
                      ("integrity/nonfinite_tensors", ""), ("training_data/hacking_flag_fraction", "")}
    step, total = r[("ood/repetition", PARENT)], r[("ood/repetition", REFERENCE)]
    assert step.passed and (step.baseline, step.baseline_version, step.threshold) == (0.09, "v2", 0.25)
    assert not total.passed and (total.baseline, total.baseline_version, total.threshold) == (0.017, "base", 0.1)
    assert total.candidate == step.candidate == 0.159
    assert [f"{x.suite}/{x.metric}" for x in m.eval_results if not x.passed] == ["ood/repetition"]
    assert "blocked: ood/repetition vs reference base: -0.1420 (worse; limit -0.1)" in m.status_reason
    assert "cumulative since base" in total.detail
    # the base was scored once for three candidates: its scores are cached (memory and eval-cache/)
    assert ev.scored_versions == ["base", "v1", "v2", "v3"]
    fresh = ScriptedEvaluator(store, settings, table)
    upload({"model.safetensors": tensor_file(4)})
    table["v4"] = scores(0.05)
    assert fresh.evaluate(store.get("m", "v4")).status == S.VERSION_STATUS_APPROVED
    assert fresh.scored_versions == ["v4"]          # parent v2 and reference base both from the store's cache

    # an operator may still force the refused one (integrity passed), as before
    assert desk.promote("m", "v3", force=True, reason="accepted the drift").version == "v3"


def test_the_reference_check_and_the_parent_check_each_block() -> None:
    """Either comparison failing blocks the candidate; both passing approves it."""
    step, total = Limits(0.1, 0.5, 0.1, 0.25), Limits(0.2, 1.0, 0.2, 0.1)
    base = scores(0.02, heldout=0.6)
    cases = [  # (parent's held-out score, candidate's, passes, the failure named)
        (0.45, 0.38, False, "heldout/rule_score vs reference base: -0.2200"),  # -0.07 per step, -0.22 in all
        (0.75, 0.60, False, "heldout/rule_score vs parent v1: -0.1500"),       # back to the base level
        (0.45, 0.50, True, ""),
    ]
    for parent_score, cand_score, ok, failed in cases:
        cand, parent = scores(0.06, heldout=cand_score), scores(0.05, heldout=parent_score)
        results = (regression_results(cand, parent, step, baseline_version="v1", comparison=PARENT)
                   + regression_results(cand, base, total, baseline_version="base", comparison=REFERENCE))
        passed, reason = verdict(results)
        assert passed is ok and failed in reason, reason
        assert reason.count("heldout/rule_score vs") == (0 if ok else 1)
    assert "(vs parent v1, reference base)" in reason


def test_an_operator_pinned_reference_per_tenant(store: WeightStore, upload: UploadFn) -> None:
    """`tenant_reference_versions` anchors one tenant's drift at a version its operator accepted; other
    tenants keep `reference_version`; retention keeps every configured reference."""
    table = {"base": scores(0.017), "v1": scores(0.2), "v2": scores(0.25), "v3": scores(0.25)}
    settings = WeightsSettings(store=LocalStoreSettings(dir=store.root), tenant_reference_versions={"acme": "v1"})
    ev = ScriptedEvaluator(store, settings, table)
    upload({"model.safetensors": tensor_file(1)}, tenant="acme")
    upload({"model.safetensors": tensor_file(2)}, tenant="acme")
    upload({"model.safetensors": tensor_file(3)}, tenant="other")
    store.update("m", "v1", lambda m: setattr(m, "status", S.VERSION_STATUS_APPROVED))

    acme = by_comparison(ev.evaluate(store.get("m", "v2")))
    assert acme[("ood/repetition", REFERENCE)].baseline_version == "v1" and acme[("ood/repetition", REFERENCE)].passed
    other = ev.evaluate(store.get("m", "v3"))
    assert by_comparison(other)[("ood/repetition", REFERENCE)].baseline_version == "base"
    assert other.status == S.VERSION_STATUS_REJECTED              # 0.233 above the base

    manifests = store.manifests.list("m")
    assert "v1" in versions_to_keep(manifests, store.state("m"), 1, settings.reference_versions())
    assert "v1" not in versions_to_keep(manifests, store.state("m"), 1)


def test_a_reference_that_is_not_stored_judges_nothing(store: WeightStore, upload: UploadFn) -> None:
    """A misconfigured reference fails the call (FAILED_PRECONDITION, naming the setting); the candidate
    stays a CANDIDATE rather than being rejected for the operator's typo."""
    ev = ScriptedEvaluator(store, WeightsSettings(store=LocalStoreSettings(dir=store.root), reference_version="v9"),
                           {"base": scores(0.02), "v1": scores(0.02)})
    upload({"model.safetensors": tensor_file(1)})
    with pytest.raises(FailedPrecondition, match="v9, the reference .* not stored.*REFERENCE_VERSION"):
        ev.evaluate(store.get("m", "v1"))
    assert store.get("m", "v1").status == S.VERSION_STATUS_CANDIDATE


def test_settings_reject_bad_reference_names() -> None:
    with pytest.raises(ValueError, match="not a version name"):
        WeightsSettings(reference_version="../v1")
    with pytest.raises(ValueError, match="not a tenant name"):
        WeightsSettings(tenant_reference_versions={"a/b": "v1"})
    with pytest.raises(ValueError, match="drift.ood_max_repetition_rise"):
        WeightsSettings.model_validate({"drift": {"ood_max_repetition_rise": -1}})
    assert math.isclose(WeightsSettings().drift.ood_max_loglik_drop, 2 * WeightsSettings().gate.ood_max_loglik_drop)
