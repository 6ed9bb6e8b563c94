"""vLLM worker extension: checkpoint files on the pod's disk --> the running model's weights, in place.

vLLM instantiates this mix-in inside each worker (GPU, or the CPU backend's; engine argument
`worker_extension_cls`), and the engine reaches it with `collective_rpc("apprentice_load_weights",
args=(path,))`. `load_weights` takes Hugging Face parameter names and handles vLLM's fused layouts (qkv,
gate_up). Imported only by vLLM.

With LoRA enabled (always, in this service) vLLM wraps each adapter-capable module after the first load
(`qkv_proj` becomes a LoRA layer whose original module is `qkv_proj.base_layer`). vLLM 0.32's wrappers
load their base layer themselves (`load_weights` on the wrapper), so checkpoint names go in unchanged
(`wrappers_load_their_base`). In releases without that, the model's own `load_weights` no longer finds
`...qkv_proj.weight`, and `route_to_base_layers` renames such tensors to
`...q_proj.base_layer.weight`; vLLM's Hugging Face name mapper then turns that into
`...qkv_proj.base_layer.weight` with the right shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from safetensors import safe_open

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


def wrappers_load_their_base(model: Any) -> bool:
    """True when vLLM's LoRA wrappers take checkpoint names themselves (vLLM 0.32: `BaseLayerWithLoRA.load_weights`
    forwards `weight` to `base_layer`), so names must stay as the checkpoint has them; `.base_layer` would
    then be looked up inside the base layer and fail."""
    suffix = "." + BASE_LAYER
    for name, _module in model.named_modules():
        if name.endswith(suffix):
            parent = model.get_submodule(name[: -len(suffix)])
            return callable(getattr(type(parent), "load_weights", None))
    return False


def read_safetensors(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(name, CPU tensor) for every tensor of every `*.safetensors` under `path`, in file order."""

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
        # heavy: torch, inside vLLM's worker process only
        import torch

        runner = self.model_runner
        if hasattr(runner, "reload_weights"):
            # vLLM 0.32: the runner reloads in place itself, undoing and redoing the kernel-specific repacking
            # done after a load (the CPU backend empties `weight` tensors it repacked; a plain `load_weights`
            # then fails on a zero-size parameter) and resetting the LoRA state built on the old weights.
            n = 0

            def counted() -> Iterator[tuple[str, Any]]:
                nonlocal n
                for item in read_safetensors(path):
                    n += 1
                    yield item

            with torch.no_grad():
                runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
            return n
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        wrapped = set() if wrappers_load_their_base(model) else wrapped_modules(model)
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        count = 0

        def tensors() -> Iterable[tuple[str, Any]]:
            nonlocal count
            for name, tensor in read_safetensors(path):
                count += 1
                yield route_to_base_layers(name, wrapped, packed), tensor

        with torch.no_grad():
            model.load_weights(weights=tensors())
        if torch.cuda.is_available() and next(model.parameters()).is_cuda:
            torch.cuda.synchronize()                  # the copies are asynchronous on a GPU only
        return count
