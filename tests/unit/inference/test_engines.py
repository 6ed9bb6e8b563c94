"""Engine factory, the vLLM engine's behaviour log-probs (pure math, no GPU), and the transformers engine:
dynamic batching, LoRA versions attached to the loaded base, full versions, and in-flight attribution."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from services.inference.engines import create_engine
from services.inference.engines.base import GenerationRequest, UnknownVersion, VersionFiles
from services.inference.settings import InferenceSettings
from shared.decoding.generation import encode_prompt, render_chat
from shared.decoding.logprobs import behaviour_logprob, filter_top_k_top_p
from shared.decoding.params import SamplingConfig
from shared.settings import CommonSettings
from tests.helpers.waiting import wait_for


def test_factory_knows_its_engines_and_imports_vllm_lazily() -> None:
    s = InferenceSettings()
    with pytest.raises(ValueError, match="unknown inference engine 'tgi'"):
        create_engine("tgi", s)
    eng = create_engine("vllm", s)            # constructing does not import vllm
    assert eng.name == "vllm" and eng.max_full_versions == 1
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="apprentice\\[gpu\\]"):
            eng.start()


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 3, 1.0),
                                                             (1.3, 0, 0.8), (0.5, 4, 0.6)])
def test_vllm_behaviour_logprob_equals_the_filtered_distribution(temperature: float, top_k: int, top_p: float) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 12, generator=g) * 2
    raw = torch.log_softmax(logits, -1)[0]                                  # what vLLM returns (T = 1)
    scaled = logits / temperature
    ref = torch.log_softmax(filter_top_k_top_p(scaled, torch.tensor([top_k]), torch.tensor([top_p])), -1)[0]
    candidates = {i: float(raw[i]) for i in range(12)}                    # full support: must be exact
    for tok in range(12):
        got = behaviour_logprob(tok, candidates, temperature, top_k, top_p)
        if math.isinf(float(ref[tok])):
            assert math.isinf(got)
        else:
            assert got == pytest.approx(float(ref[tok]), abs=1e-5)
    assert behaviour_logprob(3, candidates, 0.0, 0, 1.0) == 0.0           # greedy: a point mass


@pytest.fixture(scope="module")
def engine(tiny_model_name: str) -> Any:
    s = InferenceSettings(batch_wait_ms=30, common=CommonSettings(model=tiny_model_name))
    eng = create_engine("transformers", s)
    eng.start()
    yield eng
    eng.shutdown(timeout=5)


def _request(eng: Any, text: str, version: str = "base", **sampling: Any) -> GenerationRequest:
    ids = encode_prompt(eng.tokenizer, render_chat(eng.tokenizer, [{"role": "user", "content": text}]))
    sampling.setdefault("max_new_tokens", 8)
    return GenerationRequest(request_id=text, prompt_ids=ids, sampling=SamplingConfig(**sampling), version=version)


def test_concurrent_requests_share_one_batch(engine: Any) -> None:
    handles = [engine.submit(_request(engine, f"q{i}")) for i in range(4)]
    results = [h.result(timeout=60) for h in handles]
    assert len({h.started_at for h in handles}) == 1                        # decoded together
    solo = engine.submit(_request(engine, "q2")).result(timeout=60)
    assert solo[0].token_ids == results[2][0].token_ids                    # batching does not change greedy output


def test_unknown_version_is_refused(engine: Any) -> None:
    with pytest.raises(UnknownVersion):
        engine.submit(_request(engine, "x", version="v404"))


def _lora_dir(tmp_path: Path, tiny_model_name: str) -> Path:
    from peft import LoraConfig, get_peft_model

    from shared.models import load_model
    from shared.weights.client import save_version_files

    base, _ = load_model(tiny_model_name)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
                                                 init_lora_weights=False))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 2.0, generator=torch.Generator().manual_seed(1))
    save_version_files(peft_model, tmp_path / "lora", "lora")
    return tmp_path / "lora"


def test_lora_attaches_to_the_loaded_base_and_base_stays_base(engine: Any, tmp_path: Path, tiny_model_name: str) -> None:
    before = engine.submit(_request(engine, "hello", max_new_tokens=12)).result(timeout=60)[0]
    base_model = engine._policies["base"].backbone.model
    engine.load_version(VersionFiles("l1", "lora", _lora_dir(tmp_path, tiny_model_name)))
    assert engine._policies["l1"].backbone.model is base_model                # no second copy of the base
    h_lora = engine.submit(_request(engine, "hello", version="l1", max_new_tokens=12))
    h_base = engine.submit(_request(engine, "hello", max_new_tokens=12))
    lora, base = h_lora.result(timeout=60)[0], h_base.result(timeout=60)[0]
    assert base.token_ids == before.token_ids                                # adapter disabled for base batches
    assert lora.logprobs_t1 != pytest.approx(before.logprobs_t1, abs=1e-3)   # adapter active for its version
    engine.unload_version("l1")
    assert "l1" not in engine.loaded_versions()
    wait_for(lambda: "l1" not in engine._policies["base"].backbone.adapters, what="l1 detached from the base",
             stall_s=10)


def test_full_version_and_in_flight_attribution(engine: Any, tmp_path: Path, tiny_model_name: str) -> None:
    from shared.models import load_model
    from shared.weights.client import save_version_files

    model, _ = load_model(tiny_model_name)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():           # a clearly different policy
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    save_version_files(model, tmp_path / "full", "full")
    reference = engine.submit(_request(engine, "in flight 0", max_new_tokens=6)).result(timeout=60)[0]
    queued = [engine.submit(_request(engine, f"in flight {i}", max_new_tokens=6)) for i in range(3)]
    loader = threading.Thread(target=engine.load_version, args=(VersionFiles("f1", "full", tmp_path / "full"),))
    loader.start()
    loader.join(timeout=60)
    assert "f1" in engine.loaded_versions()
    new = engine.submit(_request(engine, "in flight 0", version="f1", max_new_tokens=6)).result(timeout=60)[0]
    old = queued[0].result(timeout=60)[0]
    assert old.logprobs_t1 == pytest.approx(reference.logprobs_t1, abs=1e-4)   # queued before: still the base
    assert new.logprobs_t1 != pytest.approx(reference.logprobs_t1, abs=1e-2)
    engine.unload_version("f1")
    assert "f1" not in engine.loaded_versions()


def test_vllm_version_check_names_the_release_and_the_install() -> None:
    from services.inference.engines.vllm_engine import check_vllm_version

    for ok in ("0.32.0", "0.32.0+cpu", "0.32.1"):
        check_vllm_version(ok)
    for bad in ("0.33.0", "0.26.0", "1.32.0"):
        with pytest.raises(RuntimeError, match=r"written for vLLM 0\.32\.x, found .*make setup-vllm"):
            check_vllm_version(bad)
    with pytest.raises(RuntimeError, match="cannot read the vLLM version 'dev'"):
        check_vllm_version("dev")
