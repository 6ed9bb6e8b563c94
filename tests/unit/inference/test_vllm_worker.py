"""The vLLM path's CPU-checkable parts: in-place weight loading into a LoRA-wrapped model (tensor names routed
to `.base_layer`), reading checkpoint files, and the GPU script's greedy comparison. No vLLM needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from services.inference.engines.vllm_worker import (
    read_safetensors,
    route_to_base_layers,
    wrapped_modules,
    wrappers_load_their_base,
)
from shared.decoding.params import Sample
from tests.helpers.greedy import compare_greedy

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


class LoRAWrapped(nn.Module):
    """Stands for vLLM's `*WithLoRA` layers: the original module becomes the child `base_layer`."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base_layer = base


def vllm_like_llama() -> nn.Module:
    """vLLM's Llama module tree after LoRA wrapping: fused qkv / gate_up wrapped, o_proj and norms not."""
    attn = nn.Module()
    attn.qkv_proj = LoRAWrapped(nn.Linear(4, 12, bias=False))
    attn.o_proj = nn.Linear(4, 4, bias=False)
    mlp = nn.Module()
    mlp.gate_up_proj = LoRAWrapped(nn.Linear(4, 16, bias=False))
    layer = nn.Module()
    layer.self_attn, layer.mlp = attn, mlp
    inner = nn.Module()
    inner.embed_tokens = LoRAWrapped(nn.Embedding(10, 4))
    inner.layers = nn.ModuleList([layer])
    inner.norm = nn.LayerNorm(4)
    model = nn.Module()
    model.model = inner
    return model


def vllm_name(checkpoint_name: str) -> str:
    """What vLLM's Hugging Face mapper does to a checkpoint name (`.q_proj` -> `.qkv_proj`, ...)."""
    for fused, parts in PACKED.items():
        for part in parts:
            if f".{part}." in checkpoint_name:
                return checkpoint_name.replace(f".{part}.", f".{fused}.", 1)
    return checkpoint_name


def test_wrapped_modules_are_the_parents_of_base_layers() -> None:
    assert wrapped_modules(vllm_like_llama()) == {
        "model.embed_tokens", "model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"}


@pytest.mark.parametrize(("name", "expected"), [
    ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.base_layer.weight"),
    ("model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.base_layer.weight"),
    ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.base_layer.weight"),
    ("model.embed_tokens.weight", "model.embed_tokens.base_layer.weight"),
    ("model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj.weight"),   # not wrapped
    ("model.norm.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("model.layers.0.self_attn.q_proj.base_layer.weight",                                     # already routed
     "model.layers.0.self_attn.q_proj.base_layer.weight"),
    ("scale", "scale"),
])
def test_checkpoint_names_are_routed_to_the_wrapped_base_layer(name: str, expected: str) -> None:
    model = vllm_like_llama()
    routed = route_to_base_layers(name, wrapped_modules(model), PACKED)
    assert routed == expected
    if name.startswith("model.") and "base_layer" not in name:
        model.get_parameter(vllm_name(routed))       # after vLLM's renaming, the parameter exists


def test_without_lora_nothing_is_renamed() -> None:
    plain = nn.Module()
    plain.model = nn.Module()
    plain.model.embed_tokens = nn.Embedding(10, 4)
    assert wrapped_modules(plain) == set()
    assert route_to_base_layers("model.layers.0.self_attn.q_proj.weight", set(), PACKED) == \
        "model.layers.0.self_attn.q_proj.weight"


class SelfLoadingWrapped(LoRAWrapped):
    """vLLM 0.32's wrappers: `load_weights` on the wrapper fills `base_layer` from the checkpoint's own names."""

    def load_weights(self, weights: object) -> set[str]:
        return set()


def test_wrappers_that_load_their_base_keep_checkpoint_names() -> None:
    assert not wrappers_load_their_base(vllm_like_llama())            # older layout: names are routed
    model = vllm_like_llama()
    model.get_submodule("model").embed_tokens = SelfLoadingWrapped(nn.Embedding(10, 4))
    assert wrappers_load_their_base(model)
    plain = nn.Module()
    plain.lin = nn.Linear(2, 2)
    assert not wrappers_load_their_base(plain)                        # no LoRA wrapping at all


def test_read_safetensors_yields_every_tensor_of_every_file(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2), "b": torch.zeros(3)}, str(tmp_path / "model-00001.safetensors"))
    save_file({"c": torch.full((1,), 7.0)}, str(tmp_path / "model-00002.safetensors"))
    got = dict(read_safetensors(tmp_path))
    assert sorted(got) == ["a", "b", "c"] and float(got["c"][0]) == 7.0
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        list(read_safetensors(tmp_path / "empty"))


def _s(ids: list[int], lps: list[float]) -> Sample:
    return Sample(token_ids=ids, logprobs=[0.0] * len(ids), logprobs_t1=lps)


def test_compare_greedy_tells_rounding_noise_from_other_weights() -> None:
    a = [_s([1, 2, 3, 4], [-1.0, -2.0, -0.5, -0.1]), _s([5, 6, 7, 8], [-0.2, -0.3, -0.4, -0.5])]
    same = compare_greedy(a, [_s([1, 2, 3, 4], [-1.0, -2.0, -0.5, -0.1]), _s([5, 6, 7, 8], [-0.2, -0.3, -0.4, -0.5])])
    assert (same.identical, same.tokens, same.common_tokens, same.max_logprob_diff) == (2, 8, 8, 0.0)
    assert same.same_model() and not same.different_model()
    # a near-tie flipped late in one sequence, log-probs within bf16 noise: still the same weights
    forked = compare_greedy(a, [_s([1, 2, 3, 9], [-1.05, -2.0, -0.52, -0.7]), _s([5, 6, 7, 8], [-0.2, -0.3, -0.4, -0.5])])
    assert forked.identical == 1 and forked.common_tokens == 7
    assert forked.max_logprob_diff == pytest.approx(0.05) and forked.same_model()
    # other weights: the sequences fork at once
    other = compare_greedy(a, [_s([9, 2, 3, 4], [-3.0, -2.0, -0.5, -0.1]), _s([5, 9, 9, 9], [-0.9, -1, -1, -1])])
    assert other.common_tokens == 1 and other.different_model()
    # same tokens but log-probs moved far beyond rounding: other weights too
    moved = compare_greedy(a, [_s([1, 2, 3, 4], [-2.0, -2.0, -0.5, -0.1]), _s([5, 6, 7, 8], [-0.2, -0.3, -0.4, -0.5])])
    assert moved.max_logprob_diff == pytest.approx(1.0) and moved.different_model()
