"""Prompts --> sampled completions with per-token log-probs, for any Hugging Face causal LM.

One decode loop (KV cache, left padding, per-row sampling parameters, per-row stopping) shared by the
inference engine, the trainer's on-policy sampling, the weights eval gate and the demo's evaluation.

Log-prob semantics (the trainer's importance ratios depend on them; see `Interaction` in events.proto):
- `logprobs[t]`    = log p_behaviour(y_t): the distribution the token was actually drawn from, i.e.
                     softmax(filter_top_k_top_p(logits_t / T)). Greedy decoding (T = 0) is a point mass: 0.0.
- `logprobs_t1[t]` = log softmax(logits_t)[y_t] at temperature 1 without filtering: exactly what a trainer
                     recomputes for pi_theta(y_t | x, y_<t), so pi_old / pi_rollout uses this field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0      # 0 = greedy
    top_p: float = 1.0            # 1 = off
    top_k: int = 0                # 0 = off
    stop: tuple[str, ...] = ()    # text stops before the first occurrence
    seed: int | None = None
    n: int = 1                    # samples per prompt


@dataclass
class Sample:
    token_ids: list[int] = field(default_factory=list)   # generated tokens, EOS included when it was produced
    text: str = ""                                         # decoded, without EOS, cut before a stop string
    logprobs: list[float] = field(default_factory=list)    # behaviour distribution (see module doc)
    logprobs_t1: list[float] = field(default_factory=list) # temperature-1, unfiltered
    finish_reason: str = "length"                          # stop | length | cancelled


def render_chat(tok: Any, messages: Sequence[Mapping[str, str]] | Sequence[Any]) -> str:
    """Chat messages (dicts or ChatMessage protos) --> the exact prompt text (ChatML for SmolLM2)."""
    msgs = [{"role": m["role"], "content": m["content"]} if isinstance(m, Mapping)
            else {"role": m.role, "content": m.content} for m in messages]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def encode_prompt(tok: Any, prompt: str) -> list[int]:
    """Prompt text --> ids, parsing every special token in it as a control token. Only for text that is
    trusted to be a template; chats go through `shared.chat_template.encode_chat` (special tokens inside
    content stay text) and plain content through `encode_text`."""
    return list(tok(prompt, add_special_tokens=False)["input_ids"])


def _filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (set to -inf) tokens outside each row's top-k and nucleus (top-p). logits: (B, V)."""
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)            # (B, V)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)          # (1, V)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, logits.shape[-1])).unsqueeze(1)
    remove = ranks >= k                                                                 # beyond top-k
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    cum_before = torch.cumsum(probs, dim=-1) - probs                                    # mass ranked above
    remove |= cum_before >= top_p.unsqueeze(1)                                          # keeps >= 1 token
    mask = torch.zeros_like(remove).scatter(1, sorted_idx, remove)
    return logits.masked_fill(mask, float("-inf"))


def _first_stop(text: str, stops: Sequence[str]) -> int:
    cut = -1
    for s in stops:
        i = text.find(s)
        if i >= 0 and (cut < 0 or i < cut):
            cut = i
    return cut


@torch.no_grad()
def generate(model: Any, tok: Any, prompts: Sequence[str | Sequence[int]],
             params: SamplingConfig | Sequence[SamplingConfig] | None = None, *,
             should_cancel: Callable[[int], bool] | None = None,
             on_token: Callable[[int, int, int, str], None] | None = None,
             **kwargs: Any) -> list[list[Sample]]:
    """Sample `n` completions for each prompt; returns samples[prompt_index][sample_index].

    `params` may differ per prompt (the inference engine batches unrelated requests). Keyword
    arguments (max_new_tokens=..., temperature=...) build one SamplingConfig for all prompts.
    `should_cancel(prompt_index)` ends that prompt's rows early ("cancelled"); `on_token(prompt_index,
    sample_index, token_id, text_delta)` streams tokens as they are produced.
    """
    if params is None:
        params = SamplingConfig(**kwargs)
    per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise ValueError(f"{len(per_prompt)} sampling configs for {len(prompts)} prompts")
    device = next(model.parameters()).device
    eos_ids = _eos_ids(model, tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids))

    # 1) one row per (prompt, sample), left-padded
    rows: list[tuple[int, int]] = [(p, s) for p, cfg in enumerate(per_prompt) for s in range(max(1, cfg.n))]
    ids = [encode_prompt(tok, pr) if isinstance(pr, str) else list(pr) for pr in prompts]
    width = max(len(ids[p]) for p, _ in rows)
    B = len(rows)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    for r, (p, _) in enumerate(rows):
        L = len(ids[p])
        input_ids[r, width - L:] = torch.tensor(ids[p])
        attn[r, width - L:] = 1
    input_ids, attn = input_ids.to(device), attn.to(device)
    cfgs = [per_prompt[p] for p, _ in rows]
    temp = torch.tensor([c.temperature for c in cfgs], device=device)
    top_k = torch.tensor([c.top_k for c in cfgs], device=device)
    top_p = torch.tensor([c.top_p if 0 < c.top_p < 1 else 1.0 for c in cfgs], device=device)
    max_new = [c.max_new_tokens for c in cfgs]
    gens = [_generator(c.seed, s) for c, (_, s) in zip(cfgs, rows, strict=True)]

    out = [Sample() for _ in rows]
    done = [m <= 0 for m in max_new]
    past = None
    step_ids, step_attn = input_ids, attn
    for _step in range(max(max_new, default=0)):
        if all(done):
            break
        position_ids = (step_attn.cumsum(-1) - 1).clamp(min=0)
        if past is not None:
            position_ids = position_ids[:, -1:]
        res = model(input_ids=step_ids, attention_mask=step_attn, position_ids=position_ids,
                    past_key_values=past, use_cache=True)
        past = res.past_key_values
        logits = res.logits[:, -1, :].float()                                              # (B, V)
        # 2) the two log-prob views: T=1 unfiltered, and the behaviour distribution
        logp_t1 = F.log_softmax(logits, dim=-1)
        scaled = logits / temp.clamp(min=1e-5).unsqueeze(1)
        logp_b = F.log_softmax(_filter_logits(scaled, top_k, top_p), dim=-1)
        next_tok = torch.empty(B, dtype=torch.long, device=device)
        for r in range(B):
            if done[r] or temp[r] <= 0:
                next_tok[r] = torch.argmax(logits[r])
            else:
                next_tok[r] = torch.multinomial(logp_b[r].exp(), 1, generator=gens[r]).squeeze()
        # 3) bookkeeping per row: logprobs, stopping, streaming
        for r, (p, s) in enumerate(rows):
            if done[r]:
                continue
            if should_cancel is not None and should_cancel(p):
                out[r].finish_reason, done[r] = "cancelled", True
                continue
            t = int(next_tok[r])
            smp = out[r]
            smp.token_ids.append(t)
            smp.logprobs_t1.append(float(logp_t1[r, t]))
            smp.logprobs.append(0.0 if temp[r] <= 0 else float(logp_b[r, t]))
            if t in eos_ids:
                smp.finish_reason, done[r] = "stop", True
                continue
            prev = smp.text
            smp.text = tok.decode([i for i in smp.token_ids if i not in eos_ids], skip_special_tokens=True)
            cut = _first_stop(smp.text, cfgs[r].stop) if cfgs[r].stop else -1
            if cut >= 0:
                smp.text = smp.text[:cut]
                smp.finish_reason, done[r] = "stop", True
            elif len(smp.token_ids) >= max_new[r]:
                done[r] = True
            if on_token is not None and len(smp.text) > len(prev):
                on_token(p, s, t, smp.text[len(prev):])
        step_ids = torch.where(torch.tensor(done, device=device), torch.full_like(next_tok, pad_id), next_tok)[:, None]
        step_attn = torch.cat([step_attn, torch.ones((B, 1), dtype=step_attn.dtype, device=device)], dim=1)

    result: list[list[Sample]] = [[] for _ in prompts]
    for r, (p, _) in enumerate(rows):
        result[p].append(out[r])
    return result


def _eos_ids(model: Any, tok: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, list | tuple):
            ids.update(int(x) for x in e)
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


def _generator(seed: int | None, sample_index: int) -> torch.Generator | None:
    if seed is None or seed == 0:
        return None
    g = torch.Generator()
    g.manual_seed((int(seed) * 1000003 + sample_index) % (1 << 63))  # distinct, reproducible; any int64 seed
    return g


def sequence_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                      temperature: float = 1.0) -> torch.Tensor:
    """log pi(y_t | x, y_<t) for each completion token, teacher-forced. Shape (len(completion_ids),).

    Runs with gradients if the caller has them enabled (the trainer); wrap in no_grad to score.
    """
    device = next(model.parameters()).device
    full = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)          # (1, P+C)
    logits = model(input_ids=full).logits[0, len(prompt_ids) - 1:-1, :].float()           # (C, V)
    logp = F.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(list(completion_ids), device=device)[:, None]).squeeze(1)
