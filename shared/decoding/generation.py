"""Prompts --> sampled completions with per-token log-probs, for any Hugging Face causal LM.

The prompts-in, samples-out form of the one decode loop (shared/decoding/batch.py), for the trainer's
on-policy sampling, the weights eval gate, the extractor's local LLM and the demo's evaluation; the
inference engine drives the loop itself. Log-prob semantics: shared/decoding/logprobs.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.decoding.batch import decode_batch
from shared.decoding.params import Sample, SamplingConfig
from shared.decoding.rows import DecodeRow


def render_chat(tok: Any, messages: Sequence[Mapping[str, str]] | Sequence[Any]) -> str:
    """Chat messages (dicts or ChatMessage protos) --> the exact prompt text (ChatML for SmolLM2)."""
    msgs = [{"role": m["role"], "content": m["content"]} if isinstance(m, Mapping)
            else {"role": m.role, "content": m.content} for m in messages]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def encode_prompt(tok: Any, prompt: str) -> list[int]:
    """Prompt text --> ids, parsing every special token in it as a control token. Only for text that is
    trusted to be a template; chats go through `shared.decoding.chat_template.encode_chat` (special tokens inside
    content stay text) and plain content through `encode_text`."""
    return list(tok(prompt, add_special_tokens=False)["input_ids"])


def generate(model: Any, tok: Any, prompts: Sequence[str | Sequence[int]],
             params: SamplingConfig | Sequence[SamplingConfig] | None = None, **kwargs: Any) -> list[list[Sample]]:
    """Sample `n` completions for each prompt; returns samples[prompt_index][sample_index].

    `params` may differ per prompt. Keyword arguments (max_new_tokens=..., temperature=...) build one
    SamplingConfig for all prompts. Prompts are text (a trusted template, `encode_prompt`) or token ids.
    All rows decode as one batch; a row's tokens do not depend on what shares it (up to float rounding).
    Prompt + completion are capped at the model's `max_position_embeddings` ("length").
    """
    if params is None:
        params = SamplingConfig(**kwargs)
    per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise ValueError(f"{len(per_prompt)} sampling configs for {len(prompts)} prompts")
    ids = [encode_prompt(tok, pr) if isinstance(pr, str) else list(pr) for pr in prompts]
    rows = [(p, DecodeRow(ids[p], cfg, sample_index=s)) for p, cfg in enumerate(per_prompt) for s in range(max(1, cfg.n))]
    decode_batch(model, tok, [r for _, r in rows])
    result: list[list[Sample]] = [[] for _ in prompts]
    for p, r in rows:
        result[p].append(r.sample)        # finished: every row ends in decode_batch
    return result
