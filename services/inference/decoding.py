"""A batch of (prompt ids, sampling parameters) rows --> completions with per-token log-probs.

The transformers engine's decode loop: one forward pass per step over every unfinished row, with a KV
cache and left padding; each row has its own temperature / top-k / top-p / seed / stop strings / token
budget, and leaves the batch as soon as it stops (its cache rows are dropped, so a long answer does not
make short ones pay). No threads, no network: the engine's scheduler calls `decode_batch`.

Log-prob semantics are exactly those of `shared.generation` (the trainer's importance ratios depend on
them; `Interaction` fields 14 and 15 in events.proto), and this module reuses its filter and seeding:
- `logprobs[t]`    = log softmax(filter_top_k_top_p(logits_t / T))[y_t], the distribution y_t was drawn
                     from; greedy (T = 0) is a point mass, recorded as 0.0;
- `logprobs_t1[t]` = log softmax(logits_t)[y_t]: temperature 1, unfiltered, what a trainer recomputes.
Both lists have one entry per generated token, EOS included when it was produced; `text` excludes EOS
and ends before the first stop string (the tokens that completed the stop string are kept).

Seeded rows draw from their own generator (`seed * 1000003 + sample_index`, as `shared.generation`), so
a seeded request gives the same tokens whatever else shares its batch (up to float rounding of padded
batches); unseeded rows share one `torch.multinomial` call per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from shared.generation import Sample, SamplingConfig
from shared.generation import _eos_ids as eos_ids_of
from shared.generation import _filter_logits as filter_top_k_top_p
from shared.generation import _generator as seeded_generator

__all__ = ["DecodeRow", "decode_batch", "eos_ids_of", "first_stop", "stream_safe_length"]


def first_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest occurrence of any stop string in `text`, or -1."""
    cut = -1
    for s in stops:
        i = text.find(s)
        if i >= 0 and (cut < 0 or i < cut):
            cut = i
    return cut


def stream_safe_length(text: str, stops: Sequence[str]) -> int:
    """How much of `text` may be streamed now: hold back an unfinished UTF-8 character (decoded as
    U+FFFD) and any suffix that could still grow into a stop string (which would then be cut)."""
    end = len(text)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    for s in stops:
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[:end].endswith(s[:k]):
                end -= k
                break
    return max(end, 0)


def sample_rows(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of `probs` (B, V) by inverting the CDF: y = min{j : cdf_j > u * cdf_V}, u ~ U[0, 1).

    Same distribution as `torch.multinomial(probs, 1)` at a fraction of its CPU cost on a 49k vocabulary
    (one cumsum + one search instead of multinomial's per-row set-up); tokens of probability 0 are never
    drawn (strict `>`)."""
    cdf = probs.cumsum(dim=-1)                                                          # (B, V)
    u = torch.rand(probs.shape[0], 1, device=probs.device) * cdf[:, -1:]                # (B, 1)
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(1)


@dataclass
class DecodeRow:
    """One sequence to decode and its running state.

    Callbacks are invoked on the decoding thread: `on_delta(token_ids, text)` while streaming (only when
    `stream`), `on_finish(sample)` exactly once. `cancelled()` is polled every step.
    """

    prompt_ids: list[int]
    params: SamplingConfig
    sample_index: int = 0
    stream: bool = False
    on_delta: Callable[[list[int], str], None] | None = None
    on_finish: Callable[[Sample], None] | None = None
    cancelled: Callable[[], bool] = lambda: False
    # --- state ---
    sample: Sample = field(default_factory=Sample)
    streamed: int = 0                      # characters of text already streamed
    pending_ids: list[int] = field(default_factory=list)   # token ids not yet streamed
    done: bool = False

    def finish(self, reason: str, eos_ids: set[int], tok: Any) -> None:
        s = self.sample
        s.finish_reason = reason
        if not (self.params.stop or self.stream) or reason == "cancelled":
            s.text = tok.decode([i for i in s.token_ids if i not in eos_ids], skip_special_tokens=True)
            if reason == "cancelled" and self.params.stop:
                cut = first_stop(s.text, self.params.stop)
                s.text = s.text[:cut] if cut >= 0 else s.text
        if self.stream and self.on_delta is not None and (len(s.text) > self.streamed or self.pending_ids):
            self.on_delta(self.pending_ids, s.text[self.streamed:])
            self.streamed, self.pending_ids = len(s.text), []
        self.done = True
        if self.on_finish is not None:
            self.on_finish(s)


def _accepts_logits_to_keep(model: Any) -> bool:
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@dataclass
class BatchStats:
    rows: int = 0
    steps: int = 0
    tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0


@torch.inference_mode()
def decode_batch(model: Any, tok: Any, rows: list[DecodeRow], *, eos_ids: set[int] | None = None,
                 context_window: int | None = None, forward: Callable[..., Any] | None = None) -> BatchStats:
    """Decode every row to completion (stop, length, or cancelled); results go to each row's callbacks.

    `model` answers eos/device questions; `forward` (default: `model`) runs the network, which lets the
    engine pass a LoRA-activated wrapper. `context_window` caps prompt + completion tokens per row.
    """
    stats = BatchStats(rows=len(rows))
    forward = forward or model
    eos = eos_ids if eos_ids is not None else eos_ids_of(model, tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos))
    device = next(model.parameters()).device
    limit = context_window or int(getattr(model.config, "max_position_embeddings", 1 << 30))

    # Rows that need no decoding at all (cancelled while queued, zero budget) finish at once.
    live = []
    for r in rows:
        if r.cancelled():
            r.finish("cancelled", eos, tok)
        elif r.params.max_new_tokens <= 0 or len(r.prompt_ids) >= limit:
            r.finish("length", eos, tok)
        else:
            live.append(r)
    if not live:
        return stats

    # 1) left-pad the prompts into one (B, W) block
    width = max(len(r.prompt_ids) for r in live)
    B = len(live)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    for i, r in enumerate(live):
        n = len(r.prompt_ids)
        input_ids[i, width - n:] = torch.tensor(r.prompt_ids, dtype=torch.long)
        attn[i, width - n:] = 1
    input_ids, attn = input_ids.to(device), attn.to(device)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)                                   # (B, W)
    next_pos = attn.sum(-1)                                                             # (B,) real tokens so far

    temp = torch.tensor([r.params.temperature for r in live], device=device)
    top_k = torch.tensor([r.params.top_k for r in live], device=device)
    top_p = torch.tensor([r.params.top_p if 0 < r.params.top_p < 1 else 1.0 for r in live], device=device)
    gens: list[torch.Generator | None] = [seeded_generator(r.params.seed, r.sample_index) for r in live]

    past = None
    step_ids, step_pos = input_ids, position_ids
    # Only the last position's logits are needed: at prefill, the full (B, W, V) projection would cost
    # more than the transformer itself on a small model.
    extra = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
    t0 = time.perf_counter()
    while live:
        out = forward(input_ids=step_ids, attention_mask=attn, position_ids=step_pos, past_key_values=past,
                      use_cache=True, **extra)
        past = out.past_key_values
        logits = out.logits[:, -1, :].float()                                           # (B, V)
        if stats.steps == 0:
            stats.prefill_s = time.perf_counter() - t0
        stats.steps += 1

        # 2) the two log-prob views and the draw
        logp_t1 = F.log_softmax(logits, dim=-1)                                         # (B, V)
        greedy = temp <= 0                                                              # (B,)
        next_tok = torch.argmax(logits, dim=-1)                                         # (B,)
        logp_b = None
        if not bool(greedy.all()):
            filtered = bool((top_k > 0).any()) or bool((top_p < 1).any())
            if not filtered and bool(((temp == 1) | greedy).all()):
                logp_b = logp_t1                                                        # T=1, unfiltered
            else:
                scaled = logits / torch.where(greedy, torch.ones_like(temp), temp).unsqueeze(1)
                if filtered:
                    scaled = filter_top_k_top_p(scaled, top_k, top_p)
                logp_b = F.log_softmax(scaled, dim=-1)                                  # (B, V)
            probs = logp_b.exp()
            is_greedy = greedy.tolist()
            shared_rows = [i for i in range(B) if not is_greedy[i] and gens[i] is None]
            if shared_rows:
                idx = torch.tensor(shared_rows, device=device)
                next_tok[idx] = sample_rows(probs[idx])
            for i in range(B):
                if not is_greedy[i] and gens[i] is not None:   # seeded generators live on the CPU
                    next_tok[i] = torch.multinomial(probs[i].cpu(), 1, generator=gens[i]).squeeze().to(device)
        toks = next_tok.tolist()
        lp_t1 = logp_t1.gather(1, next_tok[:, None]).squeeze(1).tolist()
        lp_b = ([0.0] * B if logp_b is None else
                torch.where(greedy, torch.zeros_like(temp), logp_b.gather(1, next_tok[:, None]).squeeze(1)).tolist())

        # 3) per-row bookkeeping: append, stop, stream
        keep: list[int] = []
        for i, r in enumerate(live):
            if r.cancelled():
                r.finish("cancelled", eos, tok)
                continue
            t = toks[i]
            s = r.sample
            s.token_ids.append(t)
            s.logprobs_t1.append(lp_t1[i])
            s.logprobs.append(lp_b[i])
            stats.tokens += 1
            if r.stream:
                r.pending_ids.append(t)
            if t in eos:
                r.finish("stop", eos, tok)
                continue
            if r.params.stop or r.stream:
                s.text = tok.decode([x for x in s.token_ids if x not in eos], skip_special_tokens=True)
                cut = first_stop(s.text, r.params.stop) if r.params.stop else -1
                if cut >= 0:
                    s.text = s.text[:cut]
                    r.finish("stop", eos, tok)
                    continue
            if len(s.token_ids) >= r.params.max_new_tokens or len(r.prompt_ids) + len(s.token_ids) >= limit:
                r.finish("length", eos, tok)
                continue
            if r.stream and r.on_delta is not None:
                safe = stream_safe_length(s.text, r.params.stop)
                if safe > r.streamed:
                    r.on_delta(r.pending_ids, s.text[r.streamed:safe])
                    r.streamed, r.pending_ids = safe, []
            keep.append(i)

        # 4) drop finished rows from the batch (and their KV cache)
        if len(keep) < B:
            if not keep:
                break
            sel = torch.tensor(keep, device=device)
            past.batch_select_indices(sel)
            attn, next_tok, next_pos = attn[sel], next_tok[sel], next_pos[sel]
            temp, top_k, top_p = temp[sel], top_k[sel], top_p[sel]
            gens = [gens[i] for i in keep]
            live = [live[i] for i in keep]
            B = len(live)
        step_ids = next_tok[:, None]
        step_pos = next_pos[:, None]
        next_pos = next_pos + 1
        attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=device)], dim=1)
    stats.decode_s = time.perf_counter() - t0 - stats.prefill_s
    return stats
