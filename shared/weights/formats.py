"""Which weight file formats the project accepts: safetensors only, everywhere.

A pickle-bearing checkpoint (`pytorch_model.bin`, `*.pt`, `*.ckpt`, ...) runs arbitrary code when loaded, and
the integrity check (services/weights/evaluator.py) reads only safetensors, so a NaN model saved as `.bin`
once passed it as "0 of 0 tensors". The weights service refuses these files at upload; the loaders pass
`use_safetensors=True`; the integrity check fails a version that holds one, or holds no tensor file at all.
"""

from __future__ import annotations

from pathlib import Path

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".npy", ".npz", ".mar", ".h5")
"""Suffixes of files that are (or may hold) pickles or non-safetensors weights; never accepted."""

TENSOR_SUFFIX = ".safetensors"


def pickle_bearing(path: str) -> bool:
    """True for a file name whose format may execute code when loaded (or is weights in another format)."""
    return path.lower().endswith(PICKLE_SUFFIXES)


def refusal(path: str) -> str:
    """The message an upload of such a file gets."""
    return (f"file {path!r}: only safetensors weights are accepted (pickle-bearing formats such as "
            f"{', '.join(PICKLE_SUFFIXES[:5])} run code when loaded); save with safe_serialization=True")


ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""peft's adapter file name in safetensors; peft falls back to `adapter_model.bin` (torch.load) when it is
missing, whatever `use_safetensors` says, so the loaders check the directory first (`require_safetensors`)."""


class UnsafeWeights(ValueError):
    """A weights directory that would load a pickle, or that holds no safetensors weights to load."""


def require_safetensors(directory: Path | str, *, adapter: bool) -> None:
    """Raise `UnsafeWeights` unless `directory` holds safetensors weights and no pickle-bearing file: called
    before every `from_pretrained` of stored weights (an adapter needs `adapter_model.safetensors`, a full
    model any `*.safetensors`), so a `.bin` planted next to or instead of them is never what gets loaded."""
    d = Path(directory)
    pickles = sorted(p.name for p in d.rglob("*") if p.is_file() and pickle_bearing(p.name))
    if pickles:
        raise UnsafeWeights(f"{d}: refusing to load weights next to pickle-bearing files ({', '.join(pickles[:5])}); "
                            "only safetensors weights are loaded")
    if adapter and not (d / ADAPTER_WEIGHTS).is_file():
        raise UnsafeWeights(f"{d}: no {ADAPTER_WEIGHTS} (pickled adapter_model.bin adapters are refused)")
    if not adapter and not any(p.name.endswith(TENSOR_SUFFIX) for p in d.iterdir() if p.is_file()):
        raise UnsafeWeights(f"{d}: no *.safetensors weights (pickled pytorch_model.bin checkpoints are refused)")
