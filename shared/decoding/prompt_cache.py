"""Exact prompt --> its prefill (per-layer keys and values, the last position's logits), kept for reuse.

Continuous batching prefills each request as it joins, one or two at a time; static batching prefills a
whole batch at once and shares one prefill between identical prompts. Traffic repeats prompts (retries,
n > 1 across calls, popular questions, eval sets), so the continuous engine keeps recent prefills and
joins a repeated prompt without a forward pass: its keys and values are copied into the joining group.

Keys are (salt, adapter identity, prompt token ids). The salt is the requesting tenant: a hit answers
faster than a miss, so an entry shared across tenants would tell one tenant what another recently asked
(the timing side channel of shared prefix caches). An adapter's identity changes whenever its LoRA slot is
reused (services/inference/multi_lora.py `slot_key`), and a cache belongs to one set of full weights (one
backbone). Bounded by bytes, least recently used out first. No threads: the scheduler thread owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

Key = tuple[str, int, tuple[int, ...]]


@dataclass(frozen=True)
class Prefill:
    """One prompt's prefill: per layer (keys, values), each (1, kv_heads, L, head_dim); logits (V,)."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    logits: torch.Tensor

    @staticmethod
    def view(past: Any, logits: torch.Tensor, row: int, length: int) -> Prefill:
        """Row `row` of a left-padded prefill (a cache with `.layers` of (B, kv, W, d) keys and values,
        logits (B, V)), its last `length` columns: views, no copy."""
        width = int(past.layers[0].keys.shape[2])
        return Prefill(tuple((la.keys[row:row + 1, :, width - length:], la.values[row:row + 1, :, width - length:])
                             for la in past.layers), logits[row])

    def copy(self) -> Prefill:
        return Prefill(tuple((k.clone(), v.clone()) for k, v in self.layers), self.logits.clone())

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers) + self.logits.nbytes


class PromptCache:
    """Least-recently-used prefills within `max_bytes` (0 disables it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Key, Prefill] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Key) -> Prefill | None:
        got = self._items.get(key)
        if got is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return got

    def put(self, key: Key, prefill: Prefill) -> None:
        size = prefill.nbytes
        if size > self.max_bytes or key in self._items:
            return
        while self._items and self.bytes + size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.nbytes
        self._items[key] = prefill
        self.bytes += size


def assemble(prefills: list[Prefill], width: int) -> tuple[Any, torch.Tensor]:
    """Prefills of different lengths --> one cache, each row right-aligned (left-padded with zeros) to
    `width` columns, and their last logits (U, V): the shape a batched prefill of those prompts has."""
    # heavy: transformers, only for a model's cache
    from transformers.cache_utils import DynamicCache

    first = prefills[0]
    logits = torch.stack([p.logits for p in prefills])
    past = DynamicCache()
    for i, (k0, v0) in enumerate(first.layers):
        k = k0.new_zeros((len(prefills), k0.shape[1], width, k0.shape[3]))
        v = v0.new_zeros((len(prefills), v0.shape[1], width, v0.shape[3]))
        for u, p in enumerate(prefills):
            pk, pv = p.layers[i]
            k[u, :, width - pk.shape[2]:] = pk[0]
            v[u, :, width - pv.shape[2]:] = pv[0]
        past.update(k, v, i)
    return past, logits
