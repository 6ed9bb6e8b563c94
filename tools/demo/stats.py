"""Success counts --> 95% confidence intervals (Wilson) and the interval of a difference (Newcombe).

Why these: with 20-100 binary outcomes and rates near 0, the normal approximation gives intervals that
cross 0 or 1; Wilson's score interval does not, and Newcombe's method 10 combines two Wilson intervals
into an interval for p2 - p1 with good coverage (Newcombe 1998, Statistics in Medicine 17:873).
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054


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
