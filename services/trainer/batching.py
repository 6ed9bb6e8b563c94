"""(prompt ids, completion ids) pairs --> right-padded token tensors plus the flat index of every
completion token, so that the LM head runs only where a completion token is predicted.

Right padding needs no attention mask for a causal LM: a real token never attends to the padding that
follows it, so the forward takes the fast causal path and positions are simply 0..L-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class SeqBatch:
    input_ids: torch.Tensor        # (B, L) long, prompt + completion, right-padded
    completion_ids: torch.Tensor   # (B, T) long, 0 on padding
    completion_mask: torch.Tensor  # (B, T) float {0, 1}
    rows: torch.Tensor             # (N,) long: sequence of each completion token (N = Σ |y_i|)
    cols: torch.Tensor             # (N,) long: position in input_ids whose output predicts that token
    tpos: torch.Tensor             # (N,) long: index of the token within its completion

    @property
    def num_tokens(self) -> int:
        return int(self.rows.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> SeqBatch:
        return SeqBatch(*(t.to(device) for t in (self.input_ids, self.completion_ids, self.completion_mask,
                                                 self.rows, self.cols, self.tpos)))

    def unflatten(self, flat: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N,) per-token values --> (B, T) aligned with completion_ids (differentiable)."""
        out = flat.new_full(self.completion_ids.shape, fill)
        return out.index_put((self.rows, self.tpos), flat)

    def flatten(self, per_token: torch.Tensor) -> torch.Tensor:
        """(B, T) --> (N,) in the same order as rows/cols."""
        return per_token[self.rows, self.tpos]


def make_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int) -> SeqBatch:
    """Build a SeqBatch; every completion must have at least one token."""
    assert len(prompts) == len(completions), "one completion per prompt"
    assert all(len(p) > 0 for p in prompts), "a prompt needs at least one token (the LM predicts y_1 from it)"
    B = len(prompts)
    L = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    T = max((len(c) for c in completions), default=0)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    comp = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    rows: list[int] = []
    cols: list[int] = []
    tpos: list[int] = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        n = len(p) + len(c)
        input_ids[i, :n] = torch.tensor(list(p) + list(c), dtype=torch.long)
        comp[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        mask[i, :len(c)] = 1.0
        rows.extend([i] * len(c))
        cols.extend(range(len(p) - 1, len(p) - 1 + len(c)))   # output at position t predicts token t+1
        tpos.extend(range(len(c)))
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return SeqBatch(input_ids, comp, mask, as_long(rows), as_long(cols), as_long(tpos))


def micro_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices grouped into micro-batches of `size`, sorted by length so that padding is small."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[s:s + size] for s in range(0, len(order), size)]
