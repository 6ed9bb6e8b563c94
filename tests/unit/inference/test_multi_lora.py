"""Per-row LoRA (services/inference/multi_lora.py) and the adapter cache (adapter_cache.py): the gathered delta
against a hand-computed case and against peft, a mixed batch against each row alone, refusals of adapters
the engine cannot serve, and LRU eviction under a budget with pinned and draining adapters."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from services.inference.adapter_cache import AdapterCache
from services.inference.multi_lora import (
    AdapterError,
    LoraPool,
    load_adapter_weights,
    lora_delta,
    save_adapter,
)
from tests.helpers.waiting import wait_for


def test_lora_delta_matches_a_hand_computed_case() -> None:
    # slot 0 = none; slot 1: A = [1 2], B = [1 0]^T; slot 2: A = [0 1], B = [2 3]^T (scales folded into B)
    a = torch.tensor([[[0.0, 0.0]], [[1.0, 2.0]], [[0.0, 1.0]]])                    # (S=3, R=1, in=2)
    b = torch.tensor([[[0.0], [0.0]], [[1.0], [0.0]], [[2.0], [3.0]]])                # (S=3, out=2, R=1)
    x = torch.tensor([[[1.0, 1.0]], [[2.0, -1.0]], [[5.0, 7.0]]])                     # (B=3, T=1, in=2)
    got = lora_delta(x, a, b, torch.tensor([1, 2, 0]))
    # row 0: x A^T = 1 + 2 = 3 -> [3, 0]; row 1: x A^T = -1 -> [-2, -3]; row 2: no adapter -> exact zeros
    assert got.tolist() == [[[3.0, 0.0]], [[-2.0, -3.0]], [[0.0, 0.0]]]


def _random_adapter(model: Any, modules: list[str], rank: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = {n: (m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = {}
    for name in modules:
        fan_in, fan_out = shapes[name]
        out[name] = (torch.randn(rank, fan_in, generator=g) * 0.3, torch.randn(fan_out, rank, generator=g) * 0.3)
    return out


def _targets(model: Any, suffixes: tuple[str, ...]) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.endswith(suffixes)]


def test_pool_equals_peft_and_a_mixed_batch_equals_each_row_alone(tiny_model_name: str, tmp_path: Path) -> None:
    from peft import PeftModel

    from shared.models import load_model

    base, _ = load_model(tiny_model_name)
    pool = LoraPool(base)
    dirs = []
    for k, (suffixes, rank) in enumerate([(("q_proj", "v_proj"), 4), (("o_proj", "down_proj", "up_proj"), 8)]):
        mods = _random_adapter(base, _targets(base, suffixes), rank, seed=k)
        dirs.append(save_adapter(tmp_path / f"a{k}", mods, alpha=2.0 * rank))
    slots = [pool.put(load_adapter_weights(d, d.name, pool.linears)) for d in dirs]
    assert slots == [1, 2] and pool.rank == 8                     # rank-4 adapter zero-padded to the pool's 8

    ids = torch.tensor([[5, 17, 99, 3, 42, 7], [8, 8, 1000, 64, 2, 11], [300, 4, 4, 9, 123, 77]])
    with torch.no_grad():
        plain = base(input_ids=ids).logits
        with pool.route(torch.tensor([slots[0], 0, slots[1]])):             # three rows, three "tenants"
            mixed = base(input_ids=ids).logits
        alone = []
        for i, slot in enumerate([slots[0], 0, slots[1]]):
            with pool.route(torch.tensor([slot])):                          # one adapter: the fast path
                alone.append(base(input_ids=ids[i:i + 1]).logits[0])
    assert torch.equal(mixed[1], plain[1])                                  # no adapter: the base, bit for bit
    for i in range(3):
        assert torch.allclose(mixed[i], alone[i], atol=1e-5)
    assert not torch.allclose(mixed[0], plain[0], atol=1e-3)

    fresh, _ = load_model(tiny_model_name)                                  # peft's own forward, same files
    for k, d in enumerate(dirs):
        peft_model = PeftModel.from_pretrained(fresh, d).eval()
        with torch.no_grad():
            ref = peft_model(input_ids=ids[[0, 2][k]:[0, 2][k] + 1]).logits[0]
        assert torch.allclose(alone[[0, 2][k]], ref, atol=1e-5)
        fresh = peft_model.unload()


def test_adapters_the_engine_cannot_serve_are_refused_with_the_reason(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    model, _ = tiny
    pool = LoraPool(model)
    good = save_adapter(tmp_path / "good", _random_adapter(model, _targets(model, ("q_proj",)), 4, 0), alpha=8)
    with pytest.raises(AdapterError, match="rank 4 is above the engine's limit 2"):
        load_adapter_weights(good, "g", pool.linears, max_rank=2)
    cfg = json.loads((good / "adapter_config.json").read_text())
    changes: list[tuple[dict[str, Any], str]] = [
        ({"use_dora": True}, "use_dora"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"peft_type": "IA3"}, "is not LoRA")]
    for change, reason in changes:
        bad = tmp_path / f"bad-{reason}"
        bad.mkdir()
        (bad / "adapter_model.safetensors").write_bytes((good / "adapter_model.safetensors").read_bytes())
        (bad / "adapter_config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(AdapterError, match=reason):
            load_adapter_weights(bad, "b", pool.linears)
    wrong = {"model.layers.0.self_attn.q_proj": (torch.zeros(4, 65), torch.zeros(64, 4))}
    with pytest.raises(AdapterError, match="needs A \\(r, 64\\)"):
        load_adapter_weights(save_adapter(tmp_path / "shape", wrong, alpha=8), "s", pool.linears)
    with pytest.raises(AdapterError, match="no linear layer"):
        load_adapter_weights(save_adapter(tmp_path / "nolayer", {"model.nope": (torch.zeros(4, 64), torch.zeros(64, 4))},
                                          alpha=8), "n", pool.linears)
    with pytest.raises(AdapterError, match="cannot read"):
        load_adapter_weights(tmp_path / "missing", "m", pool.linears)


def _make_resident(cache: AdapterCache, v: str) -> int:
    def committed_and_ready() -> bool:
        cache.commit()
        return cache.ready(v)

    wait_for(committed_and_ready, what=f"{v} resident", stall_s=20, every=0.01)
    return cache.slot(v)


def test_cache_loads_on_demand_and_evicts_the_least_recently_used_idle_adapter(tiny: tuple[Any, Any],
                                                                               tmp_path: Path) -> None:
    model, _ = tiny
    pool = LoraPool(model)
    now = [0.0]
    cache = AdapterCache(max_count=2, wake=lambda: None, clock=lambda: now[0])
    names = ["a", "b", "c", "d"]
    for k, v in enumerate(names):
        cache.register(v, save_adapter(tmp_path / v, _random_adapter(model, _targets(model, ("v_proj",)), 2, k),
                                       alpha=4), pool)
    assert cache.resident() == [] and not cache.ready("a")        # registered, not resident: a load starts
    for v in ("a", "b"):
        _make_resident(cache, v)
        now[0] += 1
        cache.acquire(v)
        cache.release(v)
    assert cache.resident() == ["a", "b"]
    now[0] += 1
    cache.acquire("a")                                            # a: most recent, and pinned by a row
    _make_resident(cache, "c")                                    # evicts b (least recently used, idle)
    assert cache.resident() == ["a", "c"] and cache.evictions == 1
    cache.acquire("c")                                            # both resident adapters now have rows
    assert not cache.ready("d")
    time.sleep(0.2)                   # time for d's load to finish: it must still not evict a pinned adapter
    cache.commit()                                                # no idle adapter: d waits, a drains
    assert cache.resident() == ["a", "c"] and not cache.ready("a") and cache.ready("c")
    cache.release("a")                                            # a's last row ends: evicted for d
    cache.commit()
    assert cache.resident() == ["c", "d"] and cache.ready("c") and cache.evictions == 2
    assert cache.resident_bytes() == 2 * pool.slot_bytes()
    cache.close()


def test_cache_byte_budget_retire_and_failed_loads(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    model, _ = tiny
    pool = LoraPool(model)
    woken = threading.Event()
    d = [save_adapter(tmp_path / f"r{k}", _random_adapter(model, _targets(model, ("q_proj", "o_proj")), 4, k),
                      alpha=8) for k in range(3)]
    one = 2 * 2 * 4 * (64 + 64) * 4                              # 2 layers x 2 modules x r x (in + out) x fp32
    cache = AdapterCache(max_bytes=2 * one, wake=woken.set)
    for k in range(3):
        cache.register(f"r{k}", d[k], pool)
    for k in range(3):
        _make_resident(cache, f"r{k}")
        assert cache.resident_bytes() <= 2 * one
    assert woken.is_set() and len(cache.resident()) == 2 and cache.evictions == 1
    # retired while a request refers to it: kept (in memory) until that request ends, then freed
    cache.ref("r0")
    cache.retire("r0")
    for f in d[0].iterdir():
        f.unlink()
    assert _make_resident(cache, "r0") > 0                        # from the copy kept in memory
    cache.unref("r0")
    cache.commit()
    assert "r0" not in cache.resident() and not cache.registered("r0")
    # a load that fails reports why, once; the next request tries again
    for f in d[1].iterdir():
        f.write_text("garbage")
    assert cache.resident() == ["r2"]                             # r1 was the least recently used for r0
    cache.ready("r1")
    wait_for(lambda: bool(cache.failed("r1")), what="r1's load failure", stall_s=20, every=0.01)
    assert "AdapterError" in cache.failed("r1")
    cache.forget_error("r1")
    assert cache.failed("r1") == ""
    cache.close()
