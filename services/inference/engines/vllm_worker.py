"""vLLM worker extension: checkpoint files on the pod's disk --> the running model's weights, in place.

vLLM instantiates this mix-in inside each GPU worker (engine argument `worker_extension_cls`), and the
engine reaches it with `collective_rpc("apprentice_load_weights", args=(path,))`. `load_weights` takes
Hugging Face parameter names and handles vLLM's fused layouts (qkv, gate_up). Imported only by vLLM.

With LoRA enabled (always, in this service) vLLM wraps each adapter-capable module after the first load
(`qkv_proj` becomes a LoRA layer whose original module is `qkv_proj.base_layer`), so the model's own
`load_weights` no longer finds `...qkv_proj.weight`. `route_to_base_layers` renames such tensors to
`...q_proj.base_layer.weight`; vLLM's Hugging Face name mapper then turns that into
`...qkv_proj.base_layer.weight` with the right shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

BASE_LAYER = "base_layer"


def wrapped_modules(model: Any) -> set[str]:
    """Names of the modules that LoRA wrapped: the parents of every `*.base_layer` submodule."""
    suffix = "." + BASE_LAYER
    return {name[: -len(suffix)] for name, _ in model.named_modules() if name.endswith(suffix)}


def route_to_base_layers(name: str, wrapped: set[str], packed: Mapping[str, list[str]]) -> str:
    """A Hugging Face tensor name --> the name the LoRA-wrapped vLLM model loads it under.

    `packed` is the model's `packed_modules_mapping` (`{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}`): a
    checkpoint's `q_proj` lives in vLLM's `qkv_proj`. When that vLLM module is wrapped, `.base_layer` is
    inserted before the parameter name, on the checkpoint side (the name mapper still sees `q_proj`).
    """
    module, dot, param = name.rpartition(".")
    if not dot:
        return name
    parent, _, leaf = module.rpartition(".")
    fused = next((k for k, parts in packed.items() if leaf in parts), leaf)
    target = f"{parent}.{fused}" if parent else fused
    if target in wrapped and not module.endswith("." + BASE_LAYER):
        return f"{module}.{BASE_LAYER}.{param}"
    return name


def read_safetensors(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(name, CPU tensor) for every tensor of every `*.safetensors` under `path`, in file order."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors under {path}")
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, st.get_tensor(name)


class WeightReloader:
    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def apprentice_load_weights(self, path: str) -> int:
        """Load every `*.safetensors` under `path` into the model; returns the number of tensors."""
        import torch

        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        wrapped = wrapped_modules(model)
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        count = 0

        def tensors() -> Iterable[tuple[str, Any]]:
            nonlocal count
            for name, tensor in read_safetensors(path):
                count += 1
                yield route_to_base_layers(name, wrapped, packed), tensor

        model.load_weights(weights=tensors())
        torch.cuda.synchronize()
        return count
