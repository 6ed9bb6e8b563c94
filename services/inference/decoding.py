"""Rows of (prompt ids, sampling parameters) --> completions with per-token log-probs (CPU engine).

The transformers engine's decode loop, as a `DecodeBatch` that rows join and leave between steps
(continuous batching): `add` prefills a group of new rows in one forward pass and merges them into the
running batch; `step` runs one forward pass over every live row; a row leaves as soon as it stops (its
cache rows are dropped, so a long answer does not make short ones pay). Each row has its own
temperature / top-k / top-p / seed / stop strings / token budget. `decode_batch` is the static form:
one group, decoded to completion. No threads, no network: the engine's scheduler drives it.

KV-cache layout: one left-padded `DynamicCache` per batch, (B, kv_heads, W, head_dim) per layer, a 0/1
attention mask (B, W + 1) whose last column is each row's pending token, and explicit position ids (a
row's count of real tokens), so rows of different lengths share a forward pass. A joining group is
prefilled on its own (rows of one prompt, e.g. a request's n samples, share one prefill), then both
caches are left-padded to the wider one and concatenated along the batch; columns that are padding in
every row (the longest row left) are trimmed. Masked columns add exactly zero attention weight, so a
row's numbers do not depend on what shares its batch, up to float rounding.

Log-prob semantics are exactly those of `shared.generation` (the trainer's importance ratios depend on
them; `Interaction` fields 14 and 15 in events.proto), and this module reuses its filter and seeding:
- `logprobs[t]`    = log softmax(filter_top_k_top_p(logits_t / T))[y_t], the distribution y_t was drawn
                     from; greedy (T = 0) is a point mass, recorded as 0.0;
- `logprobs_t1[t]` = log softmax(logits_t)[y_t]: temperature 1, unfiltered, what a trainer recomputes.
Both lists have one entry per generated token, EOS included when it was produced; `text` excludes EOS
and ends before the first stop string (the tokens that completed the stop string are kept).

Seeded rows draw from their own generator (`seed * 1000003 + sample_index`, as `shared.generation`), so
a seeded request gives the same tokens whatever else shares its batch, and whenever it joins (up to
float rounding of padded batches); unseeded rows share one draw per step.

Preemption by recompute: `evict` takes rows out of the running batch without finishing them (their
tokens, log-probs, stream position and seeded generator stay with the row, the cache rows are dropped);
a later `add` prefills prompt + tokens so far and draws the next token from the same generator, so a
preempted row's answer is the one it would have given unpreempted (up to float rounding).

LoRA per row: a row's `adapter` is a slot of the batch's `router` (services/inference/multi_lora.py's
`LoraPool`; 0 = base weights), kept aligned with the row through joins and leaves, and every forward
pass runs inside `router.route(slots)`, so rows of different adapters share a batch. Rows with the same
prompt share a prefill only when they also share the adapter.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from services.inference.prompt_cache import Key, Prefill, PromptCache, assemble
from shared.generation import Sample, SamplingConfig
from shared.generation import _eos_ids as eos_ids_of
from shared.generation import _filter_logits as filter_top_k_top_p
from shared.generation import _generator as seeded_generator

__all__ = ["DecodeBatch", "DecodeRow", "decode_batch", "eos_ids_of", "first_stop", "stream_safe_length"]


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


def sample_rows(probs: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One draw per row of `probs` (B, V), unnormalised, by inverting the CDF in two levels: a block of
    `block` tokens from the block sums, then a token inside the block.

    Same distribution as `torch.multinomial(probs, 1)` at a fraction of its CPU cost on a 49k vocabulary:
    one vectorised pass (the block sums) instead of a full sequential cumsum or multinomial's per-row
    set-up. A token of probability 0 is never drawn: both searches look for the first cumulative sum
    strictly above u * total with u < 1 (scaled by 1 - 1e-6 so that rounding cannot reach the total)."""
    B, V = probs.shape
    nb = -(-V // block)
    p = F.pad(probs, (0, nb * block - V)) if nb * block != V else probs
    blocks = p.reshape(B, nb, block)                                                    # (B, nb, block)
    cdf = blocks.sum(dim=-1).cumsum(dim=-1)                                             # (B, nb)
    u = torch.rand(B, 1, device=probs.device) * (1 - 1e-6) * cdf[:, -1:]                # (B, 1)
    b = torch.searchsorted(cdf, u, right=True).clamp(max=nb - 1)                        # (B, 1)
    before = torch.where(b > 0, cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(u))
    inner = blocks[torch.arange(B, device=probs.device), b.squeeze(1)].cumsum(dim=-1)   # (B, block)
    r = torch.minimum(u - before, inner[:, -1:] * (1 - 1e-6)).clamp(min=0)
    j = torch.searchsorted(inner, r, right=True).clamp(max=block - 1)                   # (B, 1)
    return (b * block + j).squeeze(1)


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
    adapter: int = 0                       # LoRA slot in the batch router (0 = base weights)
    cache_salt: str = ""                   # prompt-cache namespace (the tenant): no entry is shared across salts
    # --- state ---
    generator: torch.Generator | None = None   # a seeded row's draws so far, kept while it is preempted
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


class RowRouter(Protocol):
    """Applies per-row adapters to the forward passes run inside `route` (row i gets slot slots[i])."""

    def route(self, slots: torch.Tensor) -> AbstractContextManager[None]: ...


@dataclass
class BatchStats:
    rows: int = 0
    steps: int = 0                         # forward passes (prefills included)
    tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cached_prompts: int = 0                # prompts joined from the prompt cache, without a forward pass


@dataclass
class _Group:
    """Decode state of a set of rows, aligned on the batch dimension (the running batch, or a group that
    has just been prefilled and is about to join it)."""

    rows: list[DecodeRow]
    past: Any                              # DynamicCache, (B, kv_heads, W, head_dim) per layer
    attn: torch.Tensor                     # (B, W + 1) 0/1: cache columns + the pending token
    pending: torch.Tensor                  # (B,) the token each row feeds to the next step
    pos: torch.Tensor                      # (B,) its position id (= real tokens before it)
    temp: torch.Tensor                     # (B,)
    top_k: torch.Tensor                    # (B,)
    top_p: torch.Tensor                    # (B,)
    gens: list[torch.Generator | None]
    slots: torch.Tensor                    # (B,) each row's adapter slot

    def select(self, keep: list[int]) -> None:
        """Keep rows `keep` (indices into the group), in that order."""
        if len(keep) == len(self.rows):
            return
        sel = torch.tensor(keep, device=self.attn.device)
        self.past.batch_select_indices(sel)
        self.attn, self.pending, self.pos = self.attn[sel], self.pending[sel], self.pos[sel]
        self.temp, self.top_k, self.top_p = self.temp[sel], self.top_k[sel], self.top_p[sel]
        self.slots = self.slots[sel]
        self.gens = [self.gens[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]

    def trim(self) -> None:
        """Drop leading columns that are padding in every row (left by rows that have left)."""
        k = int((self.attn != 0).to(torch.int8).argmax(dim=1).min())      # first real column, earliest row
        if k > 0:
            self.attn = self.attn[:, k:]
            for layer in self.past.layers:
                layer.keys, layer.values = layer.keys[:, :, k:], layer.values[:, :, k:]


def _left_pad_cat(a: torch.Tensor, b: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Stack `a` and `b` along dim 0, each right-aligned (left-padded with zeros) to `width` along `dim`."""
    shape = list(a.shape)
    shape[0], shape[dim] = a.shape[0] + b.shape[0], width
    out = a.new_zeros(shape)
    out.narrow(0, 0, a.shape[0]).narrow(dim, width - a.shape[dim], a.shape[dim]).copy_(a)
    out.narrow(0, a.shape[0], b.shape[0]).narrow(dim, width - b.shape[dim], b.shape[dim]).copy_(b)
    return out


def _mergeable(past: Any) -> bool:
    """Only plain dynamic layers can be padded and concatenated (sliding-window, static, quantized or
    linear-attention caches keep state this module does not know how to align)."""
    from transformers.cache_utils import DynamicLayer

    layers: list[Any] = list(getattr(past, "layers", None) or [])
    keys: list[Any] = [getattr(layer, "keys", None) for layer in layers]
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers) and \
        all(isinstance(k, torch.Tensor) and k.dim() == 4 for k in keys)


class DecodeBatch:
    """Rows decoding together on one model. Rows join with `add` and leave when they finish; `step`
    decodes one token for every live row. Results go to each row's callbacks.

    `model` answers eos/device/signature questions; the `forward` passed to `add` / `step` (default:
    `model`) runs the network, which lets the engine pass a LoRA-activated wrapper. `context_window` caps
    prompt + completion tokens per row. `router` applies rows' LoRA adapters (rows with `adapter` != 0
    need one). Not thread-safe: one scheduler thread drives a batch.
    """

    def __init__(self, model: Any, tok: Any, *, eos_ids: set[int] | None = None,
                 context_window: int | None = None, router: RowRouter | None = None,
                 cache: PromptCache | None = None) -> None:
        self.model, self.tok = model, tok
        self.router = router
        self.cache = cache if cache is not None and cache.max_bytes > 0 else None
        self.eos = eos_ids if eos_ids is not None else eos_ids_of(model, tok)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(self.eos))
        self.device = next(model.parameters()).device
        self.limit = context_window or int(getattr(model.config, "max_position_embeddings", 1 << 30))
        # Only the last position's logits are needed: at prefill, the full (B, W, V) projection would cost
        # more than the transformer itself on a small model.
        self._extra = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
        self.stats = BatchStats()
        self._run: _Group | None = None
        self._joinable = True

    @property
    def live(self) -> list[DecodeRow]:
        return self._run.rows if self._run is not None else []

    def __len__(self) -> int:
        return len(self.live)

    @property
    def width(self) -> int:
        """Cache columns per row (padding included): what one more step attends over."""
        return 0 if self._run is None else int(self._run.attn.shape[1])

    @property
    def can_join(self) -> bool:
        """Whether `add` may be called now: always on an empty batch; on a running one only when its cache
        layout can be merged (plain dynamic layers)."""
        return self._run is None or self._joinable

    # --- public steps ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def add(self, rows: Sequence[DecodeRow], forward: Callable[..., Any] | None = None) -> None:
        """Prefill `rows` (one forward pass; rows with identical prompts share it), draw their first tokens,
        and merge the rows that go on into the running batch. A row evicted earlier resumes: its prompt
        and tokens so far are prefilled and its next token drawn."""
        assert self.can_join, "this batch's cache layout cannot take new rows; wait until it is empty"
        live = self._screen(rows)
        if not live:
            return
        self.stats.rows += len(live)
        forward = forward or self.model
        device = self.device

        # 1) the distinct (adapter, cache salt, prompt) triples, prefilled (or taken from the prompt cache) as
        # one block
        assert self.router is not None or not any(r.adapter for r in live), "rows with adapters need a router"
        index: dict[tuple[int, str, tuple[int, ...]], int] = {}
        of_row = [index.setdefault((r.adapter, r.cache_salt, tuple(r.prompt_ids + r.sample.token_ids)), len(index))
                  for r in live]
        fresh = {index[(r.adapter, r.cache_salt, tuple(r.prompt_ids))] for r in live if not r.sample.token_ids}
        past, logits, attn = self._prefill([(a, ids) for a, _, ids in index], [salt for _, salt, _ in index],
                                           fresh, forward)
        if len(index) < len(live):                           # one row per sample: share the prompt's cache
            sel = torch.tensor(of_row, device=device)
            past.batch_select_indices(sel)
            logits, attn = logits[sel], attn[sel]

        # 2) the first token of every row, then the rows that go on join
        group = _Group(
            rows=live, past=past, attn=attn, pending=torch.zeros(len(live), dtype=torch.long, device=device),
            pos=attn.sum(-1),
            temp=torch.tensor([r.params.temperature for r in live], device=device),
            top_k=torch.tensor([r.params.top_k for r in live], device=device),
            top_p=torch.tensor([r.params.top_p if 0 < r.params.top_p < 1 else 1.0 for r in live], device=device),
            gens=[r.generator if r.sample.token_ids else seeded_generator(r.params.seed, r.sample_index)
                  for r in live],
            slots=torch.tensor([r.adapter for r in live], dtype=torch.long, device=device))
        self._advance(group, logits, first=True)
        if group.rows:
            self._merge(group)

    def _prefill(self, prompts: list[tuple[int, tuple[int, ...]]], salts: list[str], fresh: set[int],
                 forward: Callable[..., Any]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """(adapter slot, token ids) pairs --> (cache (U, kv, W, d) per layer, last logits (U, V), mask (U, W)),
        left-padded to the longest. Prompts in the prompt cache are copied, the others run in one forward
        pass; new prompts (`fresh`: not a preempted row's prompt + tokens so far) are cached after it."""
        device = self.device
        cache = self.cache if forward is self.model else None      # a wrapper's prefills are its own
        keys = [self._cache_key(slot, salt, ids) if cache is not None else None
                for (slot, ids), salt in zip(prompts, salts, strict=True)]
        cached = [cache.get(k) if cache is not None and k is not None else None for k in keys]
        miss = [u for u in range(len(prompts)) if cached[u] is None]
        width = max(len(ids) for _, ids in prompts)
        attn = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for u, (_, ids) in enumerate(prompts):
            attn[u, width - len(ids):] = 1
        if miss:
            wm = max(len(prompts[u][1]) for u in miss)
            ids_m = torch.full((len(miss), wm), self.pad_id, dtype=torch.long)
            for j, u in enumerate(miss):
                p = prompts[u][1]
                ids_m[j, wm - len(p):] = torch.tensor(p, dtype=torch.long)
            attn_m = attn[miss][:, width - wm:]
            slots = torch.tensor([prompts[u][0] for u in miss], dtype=torch.long, device=device)
            t0 = time.perf_counter()
            with self._route(slots):
                out = forward(input_ids=ids_m.to(device), attention_mask=attn_m,
                              position_ids=(attn_m.cumsum(-1) - 1).clamp(min=0), past_key_values=None,
                              use_cache=True, **self._extra)
            self.stats.prefill_s += time.perf_counter() - t0
            self.stats.steps += 1
            run, logits_m = out.past_key_values, out.logits[:, -1, :].float()               # (M, V)
            if len(miss) == len(prompts) and (cache is None or not _mergeable(run)):
                return run, logits_m, attn
            for j, u in enumerate(miss):
                view = cached[u] = Prefill.view(run, logits_m, j, len(prompts[u][1]))
                key = keys[u]
                if cache is not None and u in fresh and key is not None and _mergeable(run):
                    cache.put(key, view.copy())      # kept: a copy, not a view of this batch's cache
            if len(miss) == len(prompts):
                return run, logits_m, attn
        self.stats.cached_prompts += len(prompts) - len(miss)
        past, logits = assemble([c for c in cached if c is not None], width)
        return past, logits, attn

    def _cache_key(self, slot: int, salt: str, ids: tuple[int, ...]) -> Key | None:
        """The prompt cache's key for a prompt under adapter `slot` and a row's `cache_salt`: None when the
        slot's adapter has no stable identity (a router without `slot_key`)."""
        if slot == 0:
            return (salt, 0, ids)
        identity = getattr(self.router, "slot_key", None)
        return (salt, identity(slot), ids) if identity is not None else None

    @torch.inference_mode()
    def step(self, forward: Callable[..., Any] | None = None) -> int:
        """One forward pass over every live row and one token each; returns how many rows finished."""
        g = self._run
        if g is None:
            return 0
        before = len(g.rows)
        forward = forward or self.model
        t0 = time.perf_counter()
        with self._route(g.slots):
            out = forward(input_ids=g.pending[:, None], attention_mask=g.attn, position_ids=g.pos[:, None],
                          past_key_values=g.past, use_cache=True, **self._extra)
        g.past = out.past_key_values
        logits = out.logits[:, -1, :].float()                                                # (B, V)
        self._advance(g, logits, first=False)
        self.stats.decode_s += time.perf_counter() - t0
        self.stats.steps += 1
        if not g.rows:
            self._run = None
        return before - len(g.rows)

    def evict(self, rows: Sequence[DecodeRow]) -> None:
        """Take `rows` out of the running batch unfinished (recompute preemption): their cache rows go, their
        state stays with them for a later `add`. Each row's last token was drawn and recorded already;
        resuming prefills it with the rest, so it is not drawn twice."""
        g = self._run
        if g is None:
            return
        out = {id(r) for r in rows}
        keep = [i for i, r in enumerate(g.rows) if id(r) not in out]
        for i, r in enumerate(g.rows):
            if id(r) in out:
                r.generator = g.gens[i]
        if not keep:
            self._run = None
            return
        g.select(keep)
        g.trim()

    def cancel_all(self, reason: str = "cancelled") -> None:
        """Finish every live row now (engine shutdown)."""
        for r in self.live:
            r.finish(reason, self.eos, self.tok)
        self._run = None

    # --- internals ----------------------------------------------------------------------------------
    def _route(self, slots: torch.Tensor) -> AbstractContextManager[None]:
        return self.router.route(slots) if self.router is not None else contextlib.nullcontext()

    def _screen(self, rows: Sequence[DecodeRow]) -> list[DecodeRow]:
        """Rows that need decoding; the others (cancelled while queued, zero budget) finish at once."""
        live = []
        for r in rows:
            if r.cancelled():
                r.finish("cancelled", self.eos, self.tok)
            elif r.params.max_new_tokens <= 0 or len(r.prompt_ids) + len(r.sample.token_ids) >= self.limit:
                r.finish("length", self.eos, self.tok)
            else:
                live.append(r)
        return live

    def _draw(self, g: _Group, logits: torch.Tensor) -> tuple[torch.Tensor, list[float], list[float]]:
        """Each row's next token and its two log-probs (T=1 unfiltered; behaviour). logits: (B, V).

        Vocabulary-wide passes cost as much as a small model's forward pass, so they are kept few: greedy
        rows need an argmax and a logsumexp; sampled rows one softmax of the behaviour distribution (plus
        a logsumexp at T=1 when it differs), the draw, and log p of the drawn token. In a mixed batch the
        sampling passes run over every row (cheaper than copying out the sampled ones) and the greedy
        rows' draws are ignored."""
        B = logits.shape[0]
        greedy = g.temp <= 0                                                            # (B,)
        is_greedy = greedy.tolist()
        n_greedy = sum(is_greedy)
        if n_greedy == B:
            tok = torch.argmax(logits, dim=-1)
            lp = logits.gather(1, tok[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
            return tok, lp.tolist(), [0.0] * B
        plain = not (bool((g.top_k > 0).any()) or bool((g.top_p < 1).any())) and \
            bool(((g.temp == 1) | greedy).all())
        if plain:                                              # T=1, unfiltered: one distribution
            dist = logits
        else:
            dist = logits / torch.where(greedy, torch.ones_like(g.temp), g.temp).unsqueeze(1)
            if bool((g.top_k > 0).any()) or bool((g.top_p < 1).any()):
                dist = filter_top_k_top_p(dist, g.top_k, g.top_p)
        probs = torch.softmax(dist, dim=-1)                                             # (B, V)
        shared = [i for i in range(B) if not is_greedy[i] and g.gens[i] is None]
        tok = sample_rows(probs) if shared else torch.zeros(B, dtype=torch.long, device=self.device)
        for i, gen in enumerate(g.gens):
            if gen is not None and not is_greedy[i]:          # seeded generators live on the CPU
                tok[i] = torch.multinomial(probs[i].cpu(), 1, generator=gen).squeeze().to(self.device)
        if n_greedy:
            tok = torch.where(greedy, torch.argmax(logits, dim=-1), tok)
        p_tok = probs.gather(1, tok[:, None]).squeeze(1)                                # (B,)
        lp = torch.log(p_tok)                        # log p(tok) under `dist` (= T=1 when plain)
        tiny = p_tok < 1e-30                         # log of a denormal loses precision: redo exactly
        if bool(tiny.any()):
            exact = torch.log_softmax(dist, dim=-1).gather(1, tok[:, None]).squeeze(1)
            lp = torch.where(tiny, exact, lp)
        lp_t1 = lp if plain else logits.gather(1, tok[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
        lp_b = torch.where(greedy, torch.zeros_like(lp), lp)        # greedy: a point mass, recorded as 0.0
        return tok, lp_t1.tolist(), lp_b.tolist()

    def _advance(self, g: _Group, logits: torch.Tensor, *, first: bool) -> None:
        """Draw, then per row: append, stop, stream; rows that stop leave `g` (and their cache rows)."""
        next_tok, lp_t1, lp_b = self._draw(g, logits)
        toks = next_tok.tolist()
        eos, tok, limit = self.eos, self.tok, self.limit
        keep: list[int] = []
        for i, r in enumerate(g.rows):
            if r.cancelled():
                r.finish("cancelled", eos, tok)
                continue
            t = toks[i]
            s = r.sample
            s.token_ids.append(t)
            s.logprobs_t1.append(lp_t1[i])
            s.logprobs.append(lp_b[i])
            self.stats.tokens += 1
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

        # rows that stopped leave the batch (and their cache rows); the others feed their new token
        g.pending = next_tok
        if not first:
            g.pos = g.pos + 1
        if not keep:
            g.rows = []
            return
        g.select(keep)
        g.attn = torch.cat([g.attn, torch.ones((len(keep), 1), dtype=g.attn.dtype, device=self.device)], dim=1)
        if not first and len(keep) < len(toks):
            g.trim()

    def _merge(self, new: _Group) -> None:
        """Join a freshly prefilled group to the running rows: left-pad both caches to the wider one and
        concatenate along the batch (one copy of each layer)."""
        if self._run is None:
            self._run = new
            self._joinable = _mergeable(new.past)
            return
        run = self._run
        width = max(run.attn.shape[1], new.attn.shape[1])                # cache columns + 1
        for la, lb in zip(run.past.layers, new.past.layers, strict=True):
            la.keys = _left_pad_cat(la.keys, lb.keys, width - 1, dim=2)
            la.values = _left_pad_cat(la.values, lb.values, width - 1, dim=2)
        run.attn = _left_pad_cat(run.attn, new.attn, width, dim=1)
        run.pending = torch.cat([run.pending, new.pending])
        run.pos = torch.cat([run.pos, new.pos])
        run.temp = torch.cat([run.temp, new.temp])
        run.top_k = torch.cat([run.top_k, new.top_k])
        run.top_p = torch.cat([run.top_p, new.top_p])
        run.gens = run.gens + new.gens
        run.slots = torch.cat([run.slots, new.slots])
        run.rows = run.rows + new.rows


def decode_batch(model: Any, tok: Any, rows: list[DecodeRow], *, eos_ids: set[int] | None = None,
                 context_window: int | None = None, forward: Callable[..., Any] | None = None,
                 router: RowRouter | None = None) -> BatchStats:
    """Decode every row to completion (stop, length, or cancelled); results go to each row's callbacks.

    The static form of `DecodeBatch`: one prefill of all rows, then steps until every row has stopped.
    """
    batch = DecodeBatch(model, tok, eos_ids=eos_ids, context_window=context_window, router=router)
    batch.add(rows, forward)
    while batch.live:
        batch.step(forward)
    return batch.stats
