"""Extraction prompts --> completions from any OpenAI-compatible `/chat/completions` endpoint.

For a stronger teacher than the policy (the paper notes larger extractors write better items), or a vLLM
server. Plain `urllib` (no client library); the API key is read from the environment variable named in
the settings at call time, never stored. 429 and 5xx answers are recoverable (the batch is retried).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from services.extractor.llm import ExtractorLLM, LLMRequest, LLMResponse, LLMUnavailable


class OpenAICompatibleLLM(ExtractorLLM):
    name = "openai"

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 120.0, max_workers: int = 8) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="extractor-openai")

    def _post(self, r: LLMRequest) -> LLMResponse:
        body: dict[str, object] = {"model": self.model, "messages": r.messages, "max_tokens": r.max_new_tokens,
                                   "temperature": r.temperature, "top_p": r.top_p or 1.0, "n": 1}
        if r.seed:
            body["seed"] = r.seed
        if r.stop:
            body["stop"] = list(r.stop)
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - configured URL
                payload = json.loads(resp.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", errors="replace")[:300]
            if e.code == 429 or e.code >= 500:
                raise LLMUnavailable(f"{self.url}: HTTP {e.code}: {detail}") from e
            return LLMResponse(text="", model=self.model, error=f"HTTP {e.code}: {detail}")
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise LLMUnavailable(f"{self.url}: {e}") from e
        except json.JSONDecodeError as e:
            return LLMResponse(text="", model=self.model, error=f"answer is not JSON: {e}")
        try:
            text = payload["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            return LLMResponse(text="", model=self.model, error="answer has no choices[0].message.content")
        return LLMResponse(text=str(text), model=str(payload.get("model") or self.model),
                           policy_version=str(payload.get("system_fingerprint") or ""))

    def complete(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        return list(self._pool.map(self._post, requests))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
