"""Exact prompt --> its prefill (per-layer keys and values, the last position's logits), kept for reuse.

Continuous batching prefills each request as it joins, one or two at a time; static batching prefills a
whole batch at once and shares one prefill between identical prompts. Traffic repeats prompts (retries,
n > 1 across calls, popular questions, eval sets), so the continuous engine keeps recent prefills and
joins a repeated prompt without a forward pass: its keys and values are copied into the joining group.

Keys are (adapter identity, prompt token ids): an adapter's identity changes whenever its LoRA slot is
reused (services/inference/multi_lora.py `slot_key`), and a cache belongs to one set of full weights (one
backbone). Bounded by bytes, least recently used out first. No threads: the scheduler thread owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

Key = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class Prefill:
    """One prompt's prefill: per layer (keys, values), each (1, kv_heads, L, head_dim); logits (V,)."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    logits: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[2])

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

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
