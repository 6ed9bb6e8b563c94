"""Engines behind one interface (`base.Engine`), chosen by name: `transformers` (CPU default) or `vllm` (GPU)."""

from __future__ import annotations

from services.inference.engines.base import Engine
from services.inference.settings import InferenceSettings

ENGINES = ("transformers", "vllm")


def create_engine(name: str, settings: InferenceSettings) -> Engine:
    """The engine called `name`; vLLM is imported only when chosen (extra `gpu`)."""
    if name == "transformers":
        # heavy: torch, loaded for the engine chosen only
        from services.inference.engines.transformers_engine import TransformersEngine

        return TransformersEngine(settings)
    if name == "vllm":
        # heavy: vLLM (optional: the gpu extra), loaded for the engine chosen only
        from services.inference.engines.vllm_engine import VLLMEngine

        return VLLMEngine(settings)
    raise ValueError(f"unknown inference engine {name!r}; choose one of: {', '.join(ENGINES)}")
