"""Extraction prompts --> completions from a Hugging Face model loaded in this process (offline dev).

The batch is generated together by `shared.decoding.generation.generate` (one left-padded decode loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.extractor.llm import ExtractorLLM, LLMRequest, LLMResponse
from shared.decoding.chat_template import encode_chat
from shared.decoding.params import SamplingConfig
from shared.models import load_model


class LocalLLM(ExtractorLLM):
    name = "local"

    def __init__(self, model_name: str, *, model: Any = None, tokenizer: Any = None,
                 policy_version: str = "base") -> None:
        self.model_name = model_name
        self.policy_version = policy_version
        self._model, self._tok = model, tokenizer

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            self._model, self._tok = load_model(self.model_name)
        return self._model, self._tok

    def complete(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        # heavy: torch, only once the local model runs
        from shared.decoding.generation import generate

        model, tok = self._load()
        # trajectory text and previous items are content: special tokens in them stay text
        prompts = [encode_chat(tok, r.messages).ids for r in requests]
        params = [SamplingConfig(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                                 top_p=r.top_p or 1.0, top_k=r.top_k, stop=r.stop, seed=r.seed or None)
                  for r in requests]
        samples = generate(model, tok, prompts, params)
        return [LLMResponse(text=s[0].text, model=self.model_name, policy_version=self.policy_version)
                for s in samples]
