"""One LoRA adapter per tenant on the transformers engine (continuous batching): rows of different tenants'
adapters share batches, adapters load on demand and are evicted under a budget smaller than the number of
tenants, and no answer is ever produced with another tenant's adapter; a cold adapter's load does not hold
back other tenants' requests.

Each tenant's adapter pushes the logits toward a token of its own (its lm_head term is B = 20 e_token,
A = the direction of the base model's mean final hidden state, along which every hidden state of these
prompts lies on the positive side) and perturbs the attention projections at random, so its greedy
answers are its token repeated and its log-probs are its own: a row decoded for one step with the wrong
adapter, or with none, changes the answer. Every answer of the interleaved run is compared with the same
request run alone."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY

from services.inference.engines import create_engine
from services.inference.engines.base import GenerationRequest, RequestHandle, VersionFiles
from services.inference.engines.transformers_engine import TransformersEngine
from services.inference.multi_lora import save_adapter
from services.inference.settings import InferenceSettings
from shared.decoding.generation import encode_prompt, render_chat
from shared.decoding.params import SamplingConfig
from shared.settings import CommonSettings
from tests.helpers.waiting import wait_for

TENANTS = [f"t{k}" for k in range(8)]
BUDGET = 3                                          # adapters resident at once: fewer than tenants
PROMPTS = ["where is my parcel?", "can I return a tent after a month of camping in the rain?"]


@pytest.fixture(scope="module")
def engine(tiny_model_name: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = InferenceSettings(batch_wait_ms=5, adapter_cache_max_count=BUDGET, common=CommonSettings(model=tiny_model_name))
    eng = create_engine("transformers", s)
    assert isinstance(eng, TransformersEngine)
    eng.start()
    root = tmp_path_factory.mktemp("adapters")
    model = eng._policies["base"].backbone.model
    direction = _mean_hidden_direction(eng, model)
    g = torch.Generator().manual_seed(7)
    for k, tenant in enumerate(TENANTS):
        token = 1000 + 37 * k
        mods: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
            "lm_head": (direction[None, :].clone(), torch.zeros(model.lm_head.out_features, 1))}
        mods["lm_head"][1][token, 0] = 20.0
        for name, m in model.named_modules():
            if name.endswith(("q_proj", "v_proj")):
                mods[name] = (torch.randn(1, m.in_features, generator=g), torch.randn(m.out_features, 1, generator=g))
        eng.load_version(VersionFiles(tenant, "lora", save_adapter(root / tenant, mods, alpha=1.0), tenant=tenant))
    yield eng
    eng.shutdown(timeout=5)


def _ids(eng: Any, text: str) -> list[int]:
    return encode_prompt(eng.tokenizer, render_chat(eng.tokenizer, [{"role": "user", "content": text}]))


def _mean_hidden_direction(eng: Any, model: Any) -> torch.Tensor:
    with torch.no_grad():
        hs = torch.cat([model(input_ids=torch.tensor([_ids(eng, p)]), output_hidden_states=True).hidden_states[-1][0]
                        for p in PROMPTS])
    d = hs.mean(0)
    assert bool(((hs @ d) > 0).all())                   # every position on the positive side of the direction
    return d / d.norm()


def _submit(eng: Any, tenant: str, prompt: int, max_new: int) -> RequestHandle:
    version = tenant if tenant in TENANTS else "base"
    return eng.submit(GenerationRequest(
        request_id=f"{tenant}-{prompt}-{max_new}", prompt_ids=_ids(eng, PROMPTS[prompt]), tenant=tenant,
        sampling=SamplingConfig(max_new_tokens=max_new, temperature=0.0), version=version))


def test_no_answer_uses_another_tenants_adapter_under_mixed_batches_and_evictions(engine: Any) -> None:
    cache = engine.adapters
    pool = engine._policies["base"].backbone.lora
    seen: list[tuple[int, int]] = []                     # per forward pass: (distinct adapters, resident)

    def observe(_m: Any, _a: Any, _o: Any) -> None:
        index = pool._index
        seen.append((0 if index is None else len(set(index.tolist()) - {0}), len(cache.resident())))

    hook = engine._policies["base"].backbone.model.lm_head.register_forward_hook(observe)
    try:
        everyone = [*TENANTS, "base-tenant"]
        alone = {(t, p): _submit(engine, t, p, 12).result(timeout=120)[0] for t in everyone for p in range(2)}
        for p in range(2):                              # each tenant's answer is its own
            answers = [tuple(alone[(t, p)].token_ids) for t in everyone]
            assert len(set(answers)) == len(everyone)
        evictions_before = cache.evictions
        rng = random.Random(3)
        jobs = [(t, p, rng.randint(3, 12)) for t in everyone for p in range(2) for _ in range(2)]
        rng.shuffle(jobs)
        handles = []
        for i, job in enumerate(jobs):                  # interleaved arrivals: rows join running batches
            handles.append((job, _submit(engine, *job)))
            if i % 6 == 5:
                time.sleep(0.02)                        # staggered arrivals: the pattern under test
        for (tenant, p, max_new), h in handles:
            got = h.result(timeout=300)[0]
            ref = alone[(tenant, p)]
            assert got.token_ids == ref.token_ids[:max_new], (tenant, p)
            # same tokens; log-probs within float32 noise of a different batch shape (seen: 1.3e-4 at -8.9),
            # far below what another tenant's adapter changes (other tokens altogether, asserted above)
            assert got.logprobs_t1 == pytest.approx(ref.logprobs_t1[:max_new], abs=1e-3), (tenant, p)
    finally:
        hook.remove()
    assert cache.evictions > evictions_before            # the budget forced evictions during the mixed run
    assert max(r for _, r in seen) <= BUDGET
    assert max(n for n, _ in seen) >= 2                  # rows of different tenants' adapters in one forward
    assert (REGISTRY.get_sample_value("apprentice_inference_adapter_loads_total", {"outcome": "loaded"}) or 0.0) >= len(TENANTS)
    assert REGISTRY.get_sample_value("apprentice_inference_adapter_evictions_total") >= cache.evictions


def test_a_cold_adapter_load_does_not_hold_back_other_tenants(engine: Any) -> None:
    cache = engine.adapters
    _submit(engine, "t0", 0, 2).result(timeout=60)
    cold = next(t for t in TENANTS if t not in cache.resident())
    gate = threading.Event()
    cache._loader.submit(gate.wait, 60)                  # the loader thread is busy: the cold load must queue
    try:
        waiting = _submit(engine, cold, 1, 6)
        others = [_submit(engine, "t0", 1, 6), _submit(engine, "base-tenant", 0, 6)]
        for h in others:
            h.result(timeout=60)                        # served while the cold adapter is still not loaded
        assert not waiting.done and cold not in cache.resident()
    finally:
        gate.set()
    assert waiting.result(timeout=60)[0].token_ids
    assert cold in cache.resident()


def test_an_adapter_that_cannot_load_fails_its_requests_only(engine: Any, tmp_path: Path) -> None:
    model = engine._policies["base"].backbone.model
    d = save_adapter(tmp_path / "fragile", {"model.layers.0.self_attn.q_proj": (
        torch.zeros(2, model.config.hidden_size), torch.zeros(model.config.hidden_size, 2))}, alpha=2.0)
    engine.load_version(VersionFiles("fragile", "lora", d, tenant="t9"))
    (d / "adapter_model.safetensors").write_bytes(b"not a safetensors file")   # broken after registration
    bad = engine.submit(GenerationRequest(request_id="bad", prompt_ids=_ids(engine, PROMPTS[0]), tenant="t9",
                                          sampling=SamplingConfig(max_new_tokens=4), version="fragile"))
    good = _submit(engine, "t1", 0, 4)
    with pytest.raises(Exception, match="adapter fragile could not be loaded"):
        bad.result(timeout=60)
    assert good.result(timeout=60)[0].token_ids
    engine.unload_version("fragile")
    wait_for(lambda: not engine.adapters.registered("fragile"), what="fragile freed", stall_s=60, every=0.01)


def test_the_static_scheduler_loads_and_evicts_adapters_too(engine: Any, tiny_model_name: str) -> None:
    s = InferenceSettings(scheduler="static", batch_wait_ms=5, adapter_cache_max_count=1,
                          common=CommonSettings(model=tiny_model_name))
    static = create_engine("transformers", s)
    assert isinstance(static, TransformersEngine)
    static.start()
    try:
        for t in TENANTS[:2]:
            static.load_version(VersionFiles(t, "lora", engine.adapters._entries[t].path, tenant=t))
        for t in [*TENANTS[:2], TENANTS[0]]:
            got = _submit(static, t, 0, 6).result(timeout=120)[0]
            assert got.token_ids == _submit(engine, t, 0, 6).result(timeout=120)[0].token_ids
        assert static.adapters.evictions == 2 and static.adapters.resident() == [TENANTS[0]]
    finally:
        static.shutdown(timeout=5)


def test_the_first_adapter_of_a_backbone_joins_a_batch_already_running_on_it(engine: Any, tiny_model_name: str) -> None:
    """A pod serving only base weights gets its first LoRA version while a base batch decodes (a swap under
    load): the adapter's rows join that batch, which was built before the backbone had a router."""
    s = InferenceSettings(batch_wait_ms=5, common=CommonSettings(model=tiny_model_name))
    fresh = create_engine("transformers", s)
    assert isinstance(fresh, TransformersEngine)
    fresh.start()
    try:
        assert fresh._policies["base"].backbone.lora is None
        long = _submit(fresh, "base-tenant", 1, 100_000)     # runs until cancelled (or its context is full)
        wait_for(lambda: fresh._scheduler is not None and fresh._scheduler.batches, what="the base batch running",
                 stall_s=60, every=0.01)
        fresh.load_version(VersionFiles("t2", "lora", engine.adapters._entries["t2"].path, tenant="t2"))
        got = _submit(fresh, "t2", 0, 6).result(timeout=120)[0]
        assert not long.done                            # it joined the running batch, not a later one
        assert got.token_ids == _submit(engine, "t2", 0, 6).result(timeout=120)[0].token_ids
        long.cancel()
        assert long.result(timeout=120)[0].finish_reason == "cancelled"
    finally:
        fresh.shutdown(timeout=5)
