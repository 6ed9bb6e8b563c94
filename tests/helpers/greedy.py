"""Two greedy runs over the same prompts, compared token by token: same weights (rounding noise only) or
other weights? Used by the vLLM GPU check (`load/inference_vllm_gpu.py`) and its unit test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SAME_TOL = 0.1
"""Largest |T=1 log-prob difference| (nats) between two greedy runs of the same weights in bf16, on the
tokens both chose (a different batch layout or a prefix-cache hit changes the rounding). Measured on the
random SmolLM2-shaped model, CPU: bf16 against fp32 moves them by <= 0.015 and keeps every greedy token,
while the test adapter changes the very first greedy token of every prompt."""


@dataclass
class Agreement:
    """Two greedy runs over the same prompts, compared token by token up to each first divergence."""

    sequences: int
    identical: int            # sequences with the same token ids throughout
    tokens: int               # tokens of the first run
    common_tokens: int        # tokens before the first divergence, summed over sequences
    max_logprob_diff: float   # max |logprob_t1(a) - logprob_t1(b)| over those common tokens

    def same_model(self, tol: float = SAME_TOL) -> bool:
        """Both runs came from the same weights: at least half of the tokens come before the sequences'
        first divergences (a near-tie flipped by rounding forks a sequence late, other weights fork them
        early), and none of those tokens' log-probs moved beyond rounding noise."""
        return self.max_logprob_diff <= tol and 2 * self.common_tokens >= self.tokens

    def different_model(self, tol: float = SAME_TOL) -> bool:
        return not self.same_model(tol)


def compare_greedy(a: list[Any], b: list[Any]) -> Agreement:
    """Agreement between two lists of `Sample`s (same prompts, greedy)."""
    identical, common, worst = 0, 0, 0.0
    total = sum(len(x.token_ids) for x in a)
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x.token_ids), len(y.token_ids)) and x.token_ids[n] == y.token_ids[n]:
            worst = max(worst, abs(x.logprobs_t1[n] - y.logprobs_t1[n]))
            n += 1
        common += n
        identical += int(x.token_ids == y.token_ids)
    return Agreement(len(a), identical, total, common, worst)
