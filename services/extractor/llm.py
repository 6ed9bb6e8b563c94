"""Extraction prompts --> completions: the swappable extractor LLM (the interface; llm_kinds.py picks one).

Implementations (sibling modules):
- `inference`: the current policy through the Inference gRPC service (default; OEL's on-policy extractor);
- `openai`: any OpenAI-compatible `/chat/completions` endpoint (a stronger teacher, a vLLM server);
- `local`: a Hugging Face model in this process (offline development, no other service needed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


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
