"""Success counts --> 95% confidence intervals (Wilson), the interval of a difference (Newcombe), the
paired interval over held-out messages (bootstrap) and the smallest effect an evaluation of a given size
can see (minimum detectable effect).

Why these: with 20-100 binary outcomes and rates near 0, the normal approximation gives intervals that
cross 0 or 1; Wilson's score interval does not, and Newcombe's method 10 combines two Wilson intervals
into an interval for p2 - p1 with good coverage (Newcombe 1998, Statistics in Medicine 17:873).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

Z95 = 1.959963984540054
Z80 = 0.8416212335729143   # one-sided normal quantile of 0.80: the power of the minimum detectable effect


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0/n and n/n the bound is exactly 0 (or 1); floating point leaves it a hair off, which would put
    # the rate a hair outside its own interval (and a negative error bar in the plot).
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return (min(lo, p), max(hi, p))


def newcombe_diff(s1: int, n1: int, s2: int, n2: int, z: float = Z95) -> tuple[float, float, float]:
    """(d, lower, upper) for d = p2 - p1, Newcombe's hybrid score interval:
    lower = d - sqrt((p2-l2)² + (u1-p1)²), upper = d + sqrt((u2-p2)² + (p1-l1)²). Both counts need n > 0."""
    if n1 <= 0 or n2 <= 0:
        raise ValueError(f"newcombe_diff needs two non-empty samples (n1={n1}, n2={n2})")
    p1, p2 = s1 / n1, s2 / n2
    l1, u1 = wilson(s1, n1, z)
    l2, u2 = wilson(s2, n2, z)
    d = p2 - p1
    return (d, d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2))


def min_detectable_effect(p: float, n: int, z: float = Z95, z_power: float = Z80) -> float:
    """Smallest true difference p2 - p1 that a two-sided 95% test on two samples of n trials each finds
    with 80% power, at base rate p: MDE = (z_{1-α/2} + z_{1-β}) · sqrt(2 p (1 - p) / n) (normal
    approximation, both variances at the base rate). The interval half-width with no effect is the first
    factor alone: z_{1-α/2} · sqrt(2 p (1 - p) / n)."""
    if n <= 0:
        raise ValueError(f"min_detectable_effect needs n > 0 (got {n})")
    p = min(max(p, 0.0), 1.0)
    return (z + z_power) * math.sqrt(2 * p * (1 - p) / n)


def paired_bootstrap_diff(first: Sequence[tuple[int, int]], last: Sequence[tuple[int, int]], *, reps: int = 10000,
                          seed: int = 0) -> tuple[float, float, float]:
    """(d, lower, upper): d = Σ s2 / Σ n2 - Σ s1 / Σ n1 over the same held-out messages, with a 95% percentile
    bootstrap that resamples *messages* (each with both of its rounds' counts). Why: the samples of one
    message are correlated (an easy message is answered right by most of its samples), so Newcombe's
    interval, which counts every sample as independent, can be too narrow; resampling messages keeps that
    correlation, and pairing the rounds removes the messages' difficulty from the difference. `first[i]` and
    `last[i]` are (successes, trials) of message i in each round."""
    if len(first) != len(last) or not first:
        raise ValueError(f"paired_bootstrap_diff needs the same non-empty messages in both rounds "
                         f"({len(first)} vs {len(last)})")

    def diff(idx: Sequence[int]) -> float:
        n1, n2 = sum(first[i][1] for i in idx), sum(last[i][1] for i in idx)
        return sum(last[i][0] for i in idx) / max(1, n2) - sum(first[i][0] for i in idx) / max(1, n1)

    m = len(first)
    d = diff(range(m))
    rng = random.Random(seed)
    draws = sorted(diff([rng.randrange(m) for _ in range(m)]) for _ in range(reps))
    return (d, draws[int(0.025 * (reps - 1))], draws[int(math.ceil(0.975 * (reps - 1)))])
