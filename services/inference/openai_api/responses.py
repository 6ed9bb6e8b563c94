"""Served samples --> OpenAI response bodies (chat and text completions, whole or as stream chunks).

Every body carries the Apprentice extension `apprentice: {interaction_ids, policy_version, session_id}`
(the first stream chunk does), and `id` is the first choice's interaction id, so a backend can send
feedback on any choice. `system_fingerprint` is the policy version that answered.

Log-probs: one entry per generated token (the end-of-sequence token included when the model produced it,
as in the captured `Interaction` and in `usage.completion_tokens`). `logprob` is the behaviour log-prob
the engine recorded: log p of the token under the distribution it was drawn from (temperature, top-k and
top-p applied; 0.0 for greedy decoding, a point mass). `top_logprobs` lists the k most likely tokens
under that same distribution (the engine computes them only when asked: `SamplingConfig.top_logprobs`,
shared/decoding/logprobs.py `top_alternatives`), most likely first; a token the filter excluded shows
LOGPROB_FLOOR, and under greedy decoding every alternative but the argmax does. Streams send a choice's log-probs with its last
chunk (the engine has them once the choice is complete). `finish_reason` is the engine's: stop, length,
or cancelled (the call ended first: the client went away, the server stopped).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from shared.decoding.params import Sample
from shared.decoding.tool_calls import ToolSpec, split_answer

SESSION_HEADER_SAFE = "-_.:@/+=~"
"""Characters of a session id sent as they are in `x-apprentice-session-id`; others are percent-encoded."""

LOGPROB_FLOOR = -9999.0
"""JSON has no -inf; a log-prob below this (a token the filter had excluded) is sent as this value."""


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE's printable stand-ins --> the bytes they encode (the inverse of its
    `bytes_to_unicode` table: printable Latin-1 bytes map to themselves, the rest to U+0100 onwards)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenText:
    """Token id --> (text, UTF-8 bytes) as OpenAI reports a token: the exact bytes for byte-level BPE
    tokenizers (a token may hold part of a character; its text then shows U+FFFD), the decoded text's
    bytes for others."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        probe = tokenizer.convert_ids_to_tokens(tokenizer(" a", add_special_tokens=False)["input_ids"])
        self._bytes_of = _byte_decoder() if any("Ġ" in str(p) for p in probe) else None

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one instance per server, vocabularies are bounded
    def piece(self, token_id: int) -> tuple[str, list[int]]:
        if self._bytes_of is not None:
            raw = str(self.tok.convert_ids_to_tokens(token_id))
            if all(ch in self._bytes_of for ch in raw):
                data = bytes(self._bytes_of[ch] for ch in raw)
                return data.decode("utf-8", errors="replace"), list(data)
        text = self.tok.decode([token_id])
        return text, list(text.encode())


@dataclass(frozen=True)
class Served:
    """What every response of one call shares."""

    ids: list[str]
    version: str
    session_id: str
    model: str
    prompt_tokens: int
    created: int

    @classmethod
    def now(cls, ids: list[str], version: str, session_id: str, model: str, prompt_tokens: int) -> Served:
        return cls(ids, version, session_id, model, prompt_tokens, int(time.time()))

    @property
    def extension(self) -> dict[str, Any]:
        return {"interaction_ids": self.ids, "policy_version": self.version, "session_id": self.session_id}

    @property
    def headers(self) -> dict[str, str]:
        """Also on streams (sent before the first chunk), so a client that sees only headers and text deltas
        (LangChain's `include_response_headers`) still learns whom to send feedback about: the interaction
        ids by choice index, comma-separated, and the session the turn belongs to (percent-encoded: a
        caller's session id may hold characters a header cannot; usual ids pass unchanged)."""
        return {"x-apprentice-interaction-ids": ",".join(self.ids), "x-apprentice-policy-version": self.version,
                "x-apprentice-session-id": quote(self.session_id, safe=SESSION_HEADER_SAFE)}

    def usage(self, samples: Sequence[Sample]) -> dict[str, Any]:
        completion = sum(len(s.token_ids) for s in samples)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": cached_tokens(samples)}}

    def envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.ids[0], "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.version}


def cached_tokens(samples: Sequence[Sample | None]) -> int:
    """The prompt tokens of one call that came from the engine's prefix cache (all samples share the prompt)."""
    return max((s.cached_prompt_tokens for s in samples if s is not None), default=0)


def _lp(x: float) -> float:
    return x if x >= LOGPROB_FLOOR else LOGPROB_FLOOR


def _alternatives(sample: Sample, top: int) -> list[list[tuple[int, float]]]:
    """Per position, the engine's `top` alternatives (most likely first); where the engine gave none, the
    sampled token alone (the legacy behaviour, kept for engines that do not compute them)."""
    if top <= 0:
        return [[] for _ in sample.token_ids]
    if len(sample.top_logprobs) == len(sample.token_ids):
        return [alts[:top] for alts in sample.top_logprobs]
    return [[(t, lp)] for t, lp in zip(sample.token_ids, sample.logprobs, strict=True)]


def chat_logprobs(sample: Sample, text: TokenText, top: int) -> dict[str, Any]:
    """`choices[].logprobs` of a chat completion: `{"content": [{token, logprob, bytes, top_logprobs}]}`."""
    content = []
    for tid, lp, alts in zip(sample.token_ids, sample.logprobs, _alternatives(sample, top), strict=True):
        tok, data = text.piece(tid)
        entry: dict[str, Any] = {"token": tok, "logprob": _lp(lp), "bytes": data}
        entry["top_logprobs"] = [{"token": a_tok, "logprob": _lp(a_lp), "bytes": a_data}
                                 for a_id, a_lp in alts for a_tok, a_data in (text.piece(a_id),)]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(sample: Sample, text: TokenText, top: int) -> dict[str, Any]:
    """Legacy `/v1/completions` log-probs: tokens, token_logprobs, top_logprobs, text_offset (offsets
    into the completion text). A `top_logprobs` entry maps text to log-prob: two alternatives with the
    same text keep the more likely one."""
    tokens, offsets, pos = [], [], 0
    for tid in sample.token_ids:
        tok, _ = text.piece(tid)
        tokens.append(tok)
        offsets.append(pos)
        pos += len(tok)
    lps = [_lp(x) for x in sample.logprobs]
    tops: list[dict[str, float]] | None = None
    if top > 0:
        tops = []
        for alts in _alternatives(sample, top):
            entry: dict[str, float] = {}
            for a_id, a_lp in alts:
                entry.setdefault(text.piece(a_id)[0], _lp(a_lp))
            tops.append(entry)
    return {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets, "top_logprobs": tops}


def chat_completion(served: Served, samples: Sequence[Sample], text: TokenText,
                    logprobs: int | None) -> dict[str, Any]:
    """`logprobs`: None = off, else the number of top log-probs asked for (0..20)."""
    return {**served.envelope("chat.completion"),
            "choices": [{"index": i, "message": {"role": "assistant", "content": s.text},
                         "logprobs": None if logprobs is None else chat_logprobs(s, text, logprobs),
                         "finish_reason": s.finish_reason} for i, s in enumerate(samples)],
            "usage": served.usage(samples), "apprentice": served.extension}


def text_completion(served: Served, samples: Sequence[Sample], text: TokenText,
                    logprobs: int | None) -> dict[str, Any]:
    return {**served.envelope("text_completion"),
            "choices": [{"index": i, "text": s.text,
                         "logprobs": None if logprobs is None else completion_logprobs(s, text, logprobs),
                         "finish_reason": s.finish_reason} for i, s in enumerate(samples)],
            "usage": served.usage(samples), "apprentice": served.extension}


# --- stream chunks ---------------------------------------------------------------------------------
def chat_chunk(served: Served, choices: list[dict[str, Any]], *, usage: dict[str, int] | None = None,
               first: bool = False) -> dict[str, Any]:
    body = {**served.envelope("chat.completion.chunk"), "choices": choices}
    if usage is not None:
        body["usage"] = usage
    if first:
        body["apprentice"] = served.extension
    return body


def chat_delta(index: int, *, role: bool = False, content: str | None = None, finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def text_chunk(served: Served, choices: list[dict[str, Any]], *, usage: dict[str, int] | None = None,
               first: bool = False) -> dict[str, Any]:
    body = {**served.envelope("text_completion"), "choices": choices}
    if usage is not None:
        body["usage"] = usage
    if first:
        body["apprentice"] = served.extension
    return body


def text_delta(index: int, text: str, *, finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def attach_tool_calls(body: dict[str, Any], samples: Sequence[Sample], ids: Sequence[str],
                      tools: Sequence[ToolSpec], mode: str, parallel: bool) -> None:
    """A chat completion's choices with the calls their text made (shared/decoding/tool_calls.py): OpenAI's
    `message.tool_calls` (content null when the answer is only calls) and finish_reason `tool_calls`."""
    for choice, s, iid in zip(body["choices"], samples, ids, strict=True):
        content, calls, finish = split_answer(s.text, s.finish_reason, tools, mode, parallel=parallel, id_seed=iid)
        if calls:
            choice["message"]["content"] = content or None
            choice["message"]["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls]
            choice["finish_reason"] = finish
