"""Real, tiny safetensors files for tests that store versions without a model."""

from __future__ import annotations

import torch
from safetensors.torch import save


def tensor_file(value: float) -> bytes:
    """A one-tensor safetensors file, different per `value`: the store keeps only safetensors
    (services/weights/evaluator.py fails a version without one)."""
    return save({"w": torch.tensor([float(value)])})
