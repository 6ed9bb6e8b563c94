"""The eval gate on the real tiny model: a good candidate passes; regressed and NaN ones are blocked.

'Regressed' is built honestly from the base weights: zeroed weights (the model then only emits a
special token, so it answers nothing: the held-out rule score collapses), and weights corrupted with
unit Gaussian noise (fluency collapses: OOD log-likelihood of plain answers drops by tens of nats).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from services.weights.blob_backends import make_blob_store
from services.weights.evaluator import Evaluator, nonfinite_tensors
from services.weights.settings import LocalStoreSettings, WeightsSettings
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import weights_pb2

from .conftest import upload_dir

if TYPE_CHECKING:
    import torch

HELDOUT = """
name: tiny-heldout
graders:
  - {name: fact, type: contains, reference_key: answer, ignore_case: true}
  - {name: non_empty, type: regex, pattern: "(?s)."}
items:
  - prompt: "Which form do I need to return a jacket?"
    reference: {answer: "RT-7"}
  - prompt: "What extension reaches repairs?"
    reference: {answer: "412"}
  - prompt: "How long is the tent warranty?"
    reference: {answer: "18 months"}
"""


def write_variant(tmp: Path, name: str, change: Callable[[torch.Tensor], object] | None) -> Path:
    import torch

    from shared.models import load_model
    from shared.weights.client import save_version_files

    model, _ = load_model("tiny-random")
    if change is not None:
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                change(p)
    out = tmp / name
    save_version_files(model, out, "full")
    return out


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> dict[str, Path]:
    import torch

    tmp = tmp_path_factory.mktemp("variants")

    def nan_one(p: torch.Tensor) -> None:
        if p.dim() == 2 and p.shape[0] == 128:  # one MLP projection
            p[0, 0] = float("nan")

    return {
        "identical": write_variant(tmp, "identical", None),
        "perturbed": write_variant(tmp, "perturbed", lambda p: p.add_(torch.randn_like(p) * 1e-3)),
        "zeroed": write_variant(tmp, "zeroed", lambda p: p.zero_()),
        "noised": write_variant(tmp, "noised", lambda p: p.add_(torch.randn_like(p))),
        "nan": write_variant(tmp, "nan", nan_one),
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> WeightStore:
    """One store for the module, so the evaluator computes the base model's scores once (cached)."""
    root = tmp_path_factory.mktemp("store")
    return WeightStore(make_blob_store("local", root), root)


@pytest.fixture(scope="module")
def evaluator(store: WeightStore, tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    heldout = tmp_path_factory.mktemp("sets") / "heldout.yaml"
    heldout.write_text(HELDOUT)
    settings = WeightsSettings(store=LocalStoreSettings(dir=store.root), eval_set=heldout, eval_max_new_tokens=8)
    return Evaluator(store, settings)


def results(m: weights_pb2.Manifest, comparison: str = "parent") -> dict[str, weights_pb2.EvalResult]:
    """Results by `suite/metric`: the checks that are no comparison, and the regression checks against
    `comparison` ("parent", the version replaced; "reference", the base here)."""
    return {f"{r.suite}/{r.metric}": r for r in m.eval_results if r.comparison in ("", comparison)}


def test_good_candidates_pass(store: WeightStore, evaluator: Evaluator, variants: dict[str, Path]) -> None:
    for name in ("identical", "perturbed"):
        m = evaluator.evaluate(upload_dir(store, variants[name]))
        assert m.status == weights_pb2.VERSION_STATUS_APPROVED, m.status_reason
        r = results(m)
        regressions = ["heldout/rule_score", "ood/ref_loglik", "ood/repetition", "ood/rule_score"]
        assert [(f"{x.suite}/{x.metric}", x.comparison, x.baseline_version) for x in m.eval_results] == [
            ("integrity/nonfinite_tensors", "", ""), ("training_data/hacking_flag_fraction", "", ""),
            *((name, "parent", "base") for name in regressions), *((name, "reference", "base") for name in regressions)]
        ref = results(m, "reference")
        assert all(ref[x].baseline == r[x].baseline or math.isnan(r[x].baseline) for x in regressions)
        assert ref["ood/repetition"].threshold == 0.1 and r["ood/repetition"].threshold == 0.25
        assert r["heldout/rule_score"].baseline > 0  # the base emits text (newlines); zeroed weights emit none
        assert abs(r["ood/ref_loglik"].candidate - r["ood/ref_loglik"].baseline) < 0.05
        assert m.status_reason.startswith("passed the eval gate")


def test_zeroed_weights_are_blocked_by_the_heldout_score(store: WeightStore, evaluator: Evaluator,
                                                         variants: dict[str, Path]) -> None:
    m = evaluator.evaluate(upload_dir(store, variants["zeroed"]))
    r = results(m)
    assert m.status == weights_pb2.VERSION_STATUS_REJECTED
    assert not r["heldout/rule_score"].passed and r["heldout/rule_score"].candidate == 0.0
    assert "heldout/rule_score" in m.status_reason


def test_noised_weights_are_blocked_by_ood_likelihood(store: WeightStore, evaluator: Evaluator,
                                                      variants: dict[str, Path]) -> None:
    m = evaluator.evaluate(upload_dir(store, variants["noised"]))
    r = results(m)
    assert m.status == weights_pb2.VERSION_STATUS_REJECTED
    assert not r["ood/ref_loglik"].passed
    assert r["ood/ref_loglik"].candidate < r["ood/ref_loglik"].baseline - 5


def test_nan_weights_are_blocked_before_scoring(store: WeightStore, evaluator: Evaluator,
                                                variants: dict[str, Path]) -> None:
    assert len(nonfinite_tensors(variants["nan"])[0]) >= 1
    m = evaluator.evaluate(upload_dir(store, variants["nan"]))
    assert m.status == weights_pb2.VERSION_STATUS_REJECTED
    assert [r.metric for r in m.eval_results if not r.passed] == ["nonfinite_tensors"]
    assert "NaN/Inf" in m.status_reason


def test_reward_hacking_flag_blocks_good_weights(store: WeightStore, evaluator: Evaluator,
                                                 variants: dict[str, Path]) -> None:
    m = upload_dir(store, variants["identical"], train_metrics={"hacking_flag_fraction": 0.4})
    m = evaluator.evaluate(m)
    assert m.status == weights_pb2.VERSION_STATUS_REJECTED
    assert "training_data/hacking_flag_fraction" in m.status_reason
    m2 = evaluator.evaluate(upload_dir(store, variants["perturbed"]), extra_metrics={"hacking_flag_fraction": 0.5})
    assert m2.status == weights_pb2.VERSION_STATUS_REJECTED and m2.train_metrics["hacking_flag_fraction"] == 0.5


def test_lora_candidate_is_evaluated_on_the_base(store: WeightStore, evaluator: Evaluator,
                                                 tmp_path: Path, tiny_model_name: str) -> None:
    from peft import LoraConfig, get_peft_model

    from shared.models import load_model
    from shared.weights.client import save_version_files

    base, _ = load_model(tiny_model_name)
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8))
    save_version_files(peft, tmp_path / "adapter", "lora")
    m = evaluator.evaluate(upload_dir(store, tmp_path / "adapter", kind="lora"))
    assert m.status == weights_pb2.VERSION_STATUS_APPROVED, m.status_reason  # LoRA B starts at 0: identical model


def test_scores_are_cached_across_restarts(store: WeightStore, evaluator: Evaluator,
                                           variants: dict[str, Path]) -> None:
    """A restarted service scores only the candidate: the serving version's scores come from the store's
    eval cache, keyed by its bytes, the eval sets and the settings (another setting scores again)."""
    evaluator.evaluate(upload_dir(store, variants["identical"]))  # base's scores are cached now (at the latest)
    fresh = Evaluator(store, evaluator.settings)
    m = fresh.evaluate(upload_dir(store, variants["perturbed"]))
    assert m.status == weights_pb2.VERSION_STATUS_APPROVED and fresh.scored == 1
    assert results(m)["ood/ref_loglik"].baseline == results(m)["ood/ref_loglik"].baseline  # not NaN
    other = Evaluator(store, evaluator.settings.model_copy(update={"eval_max_new_tokens": 4}))
    other.evaluate(upload_dir(store, variants["perturbed"]))
    assert other.scored == 2  # different generation settings: the base is scored again


def test_batching_does_not_change_greedy_answers(tiny_model_name: str) -> None:
    """Sorting by length, batching and asking for the last logits only are optimisations: the gate's
    greedy answers (score_model's path: chat ids through `generate`) equal Hugging Face's own greedy
    `generate` of each prompt alone with full logits."""
    import torch

    from shared.decoding.chat_template import encode_chat
    from shared.decoding.forward import last_position_only
    from shared.decoding.generation import generate
    from shared.decoding.text import eos_ids_of
    from shared.models import load_model

    model, tok = load_model(tiny_model_name)
    assert last_position_only(model)                    # the optimisation is in force on this model
    chats = [[{"role": "user", "content": q}] for q in ("Hi", "Which form do I need to return a jacket?", "Why?")]
    prompts = [encode_chat(tok, c).ids for c in chats]
    together = [s[0].token_ids for s in generate(model, tok, prompts, max_new_tokens=6, temperature=0.0)]
    eos = sorted(eos_ids_of(model, tok))
    for p, got in zip(prompts, together, strict=True):
        ids = torch.tensor([p])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0])[0, len(p):].tolist()
        assert got == ref


def test_the_checkpoint_path_times_and_counts_the_gate_once(store: WeightStore, evaluator: Evaluator,
                                                            variants: dict[str, Path]) -> None:
    """A CheckpointPublished event (the automatic path, not an operator's Promote) runs the gate, which
    observes the duration histogram and counts its verdict; a redelivered event observes nothing."""
    from prometheus_client import REGISTRY

    from services.weights.orders import OrderDesk
    from services.weights.policy import PromotionPolicy
    from shared.contracts.events import make_envelope
    from shared.proto.apprentice.v1 import events_pb2

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    count0, sum0 = sample("apprentice_weights_eval_seconds_count"), sample("apprentice_weights_eval_seconds_sum")
    rejected0 = sample("apprentice_weights_evaluations_total", verdict="rejected")
    m = upload_dir(store, variants["nan"])            # rejected by the integrity check: no scoring, fast
    settings = WeightsSettings(store=LocalStoreSettings(dir=store.root), policy="manual")
    policy = PromotionPolicy(store, OrderDesk(store, lambda update: None), evaluator, settings)
    ev = events_pb2.CheckpointPublished(envelope=make_envelope("default", source="t"), model=m.model,
                                        version=m.version)
    assert policy.on_checkpoint(ev) == "rejected"
    assert sample("apprentice_weights_eval_seconds_count") == count0 + 1
    assert sample("apprentice_weights_eval_seconds_sum") > sum0
    assert sample("apprentice_weights_evaluations_total", verdict="rejected") == rejected0 + 1
    again = events_pb2.CheckpointPublished(envelope=make_envelope("default", source="t"), model=m.model,
                                           version=m.version)
    policy.on_checkpoint(again)                       # a new event id, the version already evaluated
    evaluator.evaluate(m)                             # and an operator's Promote reaching the gate
    assert sample("apprentice_weights_eval_seconds_count") == count0 + 1
