"""Rows of (prompt ids, sampling parameters) --> completions with per-token log-probs: the decode loop.

The one decode loop of Apprentice: the CPU inference engine's scheduler drives a `DecodeBatch` that rows
join and leave between steps (continuous batching); `decode_batch` is the static form (one group,
decoded to completion) that the engine's static scheduler and `shared.decoding.generation.generate` (trainer
sampling, eval gate, extractor's local LLM, demo) use. `add` prefills a group of new rows in one
forward pass and merges them into the running batch; `step` runs one forward pass over every live row;
a row leaves as soon as it stops (its cache rows are dropped, so a long answer does not make short ones
pay). Each row has its own temperature / top-k / top-p / seed / stop strings / token budget. Every
forward pass asks for the last position's logits only (shared/decoding/forward.py). No threads, no
network.

KV-cache layout: shared/decoding/kv_cache.py. A joining group is prefilled on its own (rows of one
prompt, e.g. a request's n samples, share one prefill), then merged into the running rows.

Log-probs: `Sample.logprobs` and `Sample.logprobs_t1` as defined in shared/decoding/logprobs.py, drawn
by shared/decoding/sampling.py `draw`. Both lists have one entry per generated token, EOS included when
it was produced; `text` excludes EOS and ends before the first stop string (the tokens that completed
the stop string are kept).

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
from typing import Any

import torch

from shared.decoding.constraints import allowed_mask, constraint_for
from shared.decoding.forward import last_position_only
from shared.decoding.kv_cache import RowGroup, mergeable
from shared.decoding.logprobs import top_alternatives
from shared.decoding.prompt_cache import Key, Prefill, PromptCache, assemble
from shared.decoding.rows import BatchStats, DecodeRow, RowRouter
from shared.decoding.sampling import draw, seeded_generator
from shared.decoding.text import eos_ids_of, first_stop, stream_safe_length

__all__ = ["DecodeBatch", "decode_batch"]


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
        self._extra = last_position_only(model)
        self.stats = BatchStats()
        self._run: RowGroup | None = None
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
        for r in live:       # a resumed row keeps its matcher; a bad grammar raises GrammarError here
            if r.params.grammar is not None and r.constraint is None:
                r.constraint = constraint_for(r.params.grammar, self.tok)
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
        hits: set[int] = set()
        past, logits, attn = self._prefill([(a, ids) for a, _, ids in index], [salt for _, salt, _ in index],
                                           fresh, forward, hits)
        for r, u in zip(live, of_row, strict=True):
            if u in hits and not r.sample.token_ids:
                r.sample.cached_prompt_tokens = len(r.prompt_ids)
        if len(index) < len(live):                           # one row per sample: share the prompt's cache
            sel = torch.tensor(of_row, device=device)
            past.batch_select_indices(sel)
            logits, attn = logits[sel], attn[sel]

        # 2) the first token of every row, then the rows that go on join
        group = RowGroup(
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
                 forward: Callable[..., Any], hits: set[int] | None = None,
                 ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """(adapter slot, token ids) pairs --> (cache (U, kv, W, d) per layer, last logits (U, V), mask (U, W)),
        left-padded to the longest. Prompts in the prompt cache are copied, the others run in one forward
        pass; new prompts (`fresh`: not a preempted row's prompt + tokens so far) are cached after it."""
        device = self.device
        cache = self.cache if forward is self.model else None      # a wrapper's prefills are its own
        keys = [self._cache_key(slot, salt, ids) if cache is not None else None
                for (slot, ids), salt in zip(prompts, salts, strict=True)]
        cached = [cache.get(k) if cache is not None and k is not None else None for k in keys]
        miss = [u for u in range(len(prompts)) if cached[u] is None]
        if hits is not None:                  # the prompts taken from the cache (the caller's usage report)
            hits.update(u for u in range(len(prompts)) if cached[u] is not None)
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
            if len(miss) == len(prompts) and (cache is None or not mergeable(run)):
                return run, logits_m, attn
            for j, u in enumerate(miss):
                view = cached[u] = Prefill.view(run, logits_m, j, len(prompts[u][1]))
                key = keys[u]
                if cache is not None and u in fresh and key is not None and mergeable(run):
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

    def _advance(self, g: RowGroup, logits: torch.Tensor, *, first: bool) -> None:
        """Draw, then per row: append, stop, stream; rows that stop leave `g` (and their cache rows)."""
        constrained = [r.constraint for r in g.rows]
        allowed = (allowed_mask(constrained, self.eos, logits.shape[-1], logits.device)
                   if any(c is not None for c in constrained) else None)
        next_tok, lp_t1, lp_b = draw(logits, g.temp, g.top_k, g.top_p, g.gens, allowed)
        want = [r.params.top_logprobs for r in g.rows]
        alts = (top_alternatives(logits, g.temp, g.top_k, g.top_p, max(want), allowed)
                if any(want) else None)
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
            if alts is not None and want[i]:
                s.top_logprobs.append(list(zip(alts[0][i][:want[i]], alts[1][i][:want[i]], strict=True)))
            self.stats.tokens += 1
            if r.stream:
                r.pending_ids.append(t)
            if t in eos:
                r.finish("stop", eos, tok)
                continue
            if r.constraint is not None:
                r.constraint.consume(t)
            if r.params.stop or r.stream:
                s.text = tok.decode([x for x in s.token_ids if x not in eos], skip_special_tokens=True)
                cut = first_stop(s.text, r.params.stop) if r.params.stop else -1
                if cut >= 0:
                    s.text = s.text[:cut]
                    r.finish("stop", eos, tok)
                    continue
            if r.constraint is not None and r.constraint.finished():   # the grammar is complete: no EOS pass
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

    def _merge(self, new: RowGroup) -> None:
        """Join a freshly prefilled group to the running rows."""
        if self._run is None:
            self._run = new
            self._joinable = mergeable(new.past)
            return
        self._run.extend(new)


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
