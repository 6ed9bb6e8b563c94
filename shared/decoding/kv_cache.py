"""The decode loop's KV-cache layout: rows of different lengths in one left-padded cache.

One `DynamicCache` per set of rows, (B, kv_heads, W, head_dim) per layer, a 0/1 attention mask
(B, W + 1) whose last column is each row's pending token, and explicit position ids (a row's count of
real tokens), so rows of different lengths share a forward pass. Joining sets are left-padded to the
wider one and concatenated along the batch; columns that are padding in every row are trimmed. Masked
columns add exactly zero attention weight, so a row's numbers do not depend on what shares its batch,
up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shared.decoding.rows import DecodeRow


@dataclass
class RowGroup:
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
        """Drop leading columns that are padding in every row (left by rows that have left). Plain dynamic
        layers only: a sliding-window layer (Gemma 3) sizes its attention mask from the count of tokens it
        has seen, which would no longer match its keys; there the padding columns stay, masked."""
        if not mergeable(self.past):
            return
        k = int((self.attn != 0).to(torch.int8).argmax(dim=1).min())      # first real column, earliest row
        if k > 0:
            self.attn = self.attn[:, k:]
            for layer in self.past.layers:
                layer.keys, layer.values = layer.keys[:, :, k:], layer.values[:, :, k:]

    def extend(self, new: RowGroup) -> None:
        """Append `new`'s rows: left-pad both caches to the wider one and concatenate along the batch
        (one copy of each layer)."""
        width = max(self.attn.shape[1], new.attn.shape[1])                # cache columns + 1
        for la, lb in zip(self.past.layers, new.past.layers, strict=True):
            la.keys = left_pad_cat(la.keys, lb.keys, width - 1, dim=2)
            la.values = left_pad_cat(la.values, lb.values, width - 1, dim=2)
        self.attn = left_pad_cat(self.attn, new.attn, width, dim=1)
        self.pending = torch.cat([self.pending, new.pending])
        self.pos = torch.cat([self.pos, new.pos])
        self.temp = torch.cat([self.temp, new.temp])
        self.top_k = torch.cat([self.top_k, new.top_k])
        self.top_p = torch.cat([self.top_p, new.top_p])
        self.gens = self.gens + new.gens
        self.slots = torch.cat([self.slots, new.slots])
        self.rows = self.rows + new.rows


def left_pad_cat(a: torch.Tensor, b: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Stack `a` and `b` along dim 0, each right-aligned (left-padded with zeros) to `width` along `dim`."""
    shape = list(a.shape)
    shape[0], shape[dim] = a.shape[0] + b.shape[0], width
    out = a.new_zeros(shape)
    out.narrow(0, 0, a.shape[0]).narrow(dim, width - a.shape[dim], a.shape[dim]).copy_(a)
    out.narrow(0, a.shape[0], b.shape[0]).narrow(dim, width - b.shape[dim], b.shape[dim]).copy_(b)
    return out


def mergeable(past: Any) -> bool:
    """Only plain dynamic layers can be padded and concatenated (sliding-window, static, quantized or
    linear-attention caches keep state this module does not know how to align)."""
    # heavy: transformers, only for a model's cache
    from transformers.cache_utils import DynamicLayer

    layers: list[Any] = list(getattr(past, "layers", None) or [])
    keys: list[Any] = [getattr(layer, "keys", None) for layer in layers]
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers) and \
        all(isinstance(k, torch.Tensor) and k.dim() == 4 for k in keys)
