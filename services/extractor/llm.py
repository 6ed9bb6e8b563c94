"""Extraction prompts --> completions: the swappable extractor LLM (ABC + factory).

Implementations (sibling modules):
- `inference`: the current policy through the Inference gRPC service (default; OEL's on-policy extractor);
- `openai`: any OpenAI-compatible `/chat/completions` endpoint (a stronger teacher, a vLLM server);
- `local`: a Hugging Face model in this process (offline development, no other service needed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.extractor.settings import ExtractorSettings


class LLMUnavailable(RuntimeError):
    """The LLM cannot answer now (down, overloaded, deadline). Recoverable: retry the batch later."""


@dataclass(frozen=True)
class LLMRequest:
    messages: list[dict[str, str]]
    tenant: str = "default"
    max_new_tokens: int = 192
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    seed: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class LLMResponse:
    text: str
    model: str = ""
    policy_version: str = ""
    error: str = ""              # a per-request, non-retryable failure (e.g. prompt rejected); text is ""


class ExtractorLLM(ABC):
    name: str = "abstract"

    @abstractmethod
    def complete(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """One response per request, in order; raises LLMUnavailable when the whole batch must be retried."""

    def close(self) -> None:  # noqa: B027 - optional hook, most implementations hold nothing
        """Release connections or models."""


def make_llm(settings: ExtractorSettings) -> ExtractorLLM:
    """The extractor LLM of `settings.llm`'s kind."""
    llm = settings.llm
    if llm.kind == "inference":
        # cycle: llm_inference subclasses ExtractorLLM of this module
        from services.extractor.llm_inference import InferenceLLM

        return InferenceLLM(llm.endpoint, model=settings.common.model, timeout_s=settings.request_timeout_s)
    if llm.kind == "openai":
        # cycle: llm_openai subclasses ExtractorLLM of this module
        from services.extractor.llm_openai import OpenAICompatibleLLM

        return OpenAICompatibleLLM(llm.base_url, llm.model, api_key_env=llm.api_key_env,
                                   timeout_s=settings.request_timeout_s)
    # cycle: llm_local subclasses ExtractorLLM of this module (and loads torch)
    from services.extractor.llm_local import LocalLLM

    return LocalLLM(llm.model or settings.common.model)
