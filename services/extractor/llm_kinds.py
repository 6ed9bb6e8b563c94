"""The extractor LLM's kind (settings `llm`, a discriminated union) --> the ExtractorLLM that serves it.

Apart from llm.py (the interface the three implementations subclass) so that the interface never imports
its implementations: no import cycle.
"""

from __future__ import annotations

from services.extractor.llm import ExtractorLLM
from services.extractor.llm_inference import InferenceLLM
from services.extractor.llm_local import LocalLLM
from services.extractor.llm_openai import OpenAICompatibleLLM
from services.extractor.settings import ExtractorSettings


def make_llm(settings: ExtractorSettings) -> ExtractorLLM:
    """The extractor LLM of `settings.llm`'s kind. LocalLLM loads its model (torch) only when built."""
    llm = settings.llm
    if llm.kind == "inference":
        return InferenceLLM(llm.endpoint, model=settings.common.model, timeout_s=settings.request_timeout_s)
    if llm.kind == "openai":
        return OpenAICompatibleLLM(llm.base_url, llm.model, api_key_env=llm.api_key_env,
                                   timeout_s=settings.request_timeout_s)
    return LocalLLM(llm.model or settings.common.model)
