"""Which weight file formats the project accepts: safetensors only, everywhere.

A pickle-bearing checkpoint (`pytorch_model.bin`, `*.pt`, `*.ckpt`, ...) runs arbitrary code when loaded, and
the integrity check (services/weights/evaluator.py) reads only safetensors, so a NaN model saved as `.bin`
once passed it as "0 of 0 tensors". The weights service refuses these files at upload; the loaders pass
`use_safetensors=True`; the integrity check fails a version that holds one, or holds no tensor file at all.
"""

from __future__ import annotations

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
