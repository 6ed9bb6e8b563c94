"""Token sequences --> how much they repeat themselves: the gate's degeneration check and the trainer's
filter on supervised targets use the same measure, so what the trainer keeps out is what the gate watches."""

from __future__ import annotations

from collections.abc import Sequence


def repetition_rate(ids: Sequence[int], n: int = 3) -> float:
    """Share of the sequence's n-grams that repeat an earlier one: 1 - unique / total (0 below n tokens).

    [1,2,3,1,2,3] has 3-grams 123,231,312,123 -> 1 - 3/4 = 0.25; a model stuck on one token gives ~1.
    """
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0
