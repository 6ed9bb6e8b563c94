"""The learning rate of each optimizer step: a linear warm-up over the trainer's first steps, then constant.

Why a warm-up: Adam divides the first moment by the root of the second, and at the first step both come
from one gradient, so m̂/√v̂ = g/|g| = ±1 for every weight: each weight moves by the full learning rate
at once (a sign step), whatever its gradient's size, until v̂ has seen enough steps to be an average. In
full fine-tuning that is every one of the model's weights moving together. Measured on the routing demo
(full fine-tuning of SmolLM2-135M, GRPO, lr 2e-5, no warm-up): the policy was 7.8 nats/token from the base
model after the first step, and held-out routing fell from 24% to 15% after that round (docs/demo.md).
The count is the trainer's lifetime step (`Policy.steps`, kept in its checkpoints), so a restarted trainer
does not warm up again.
"""

from __future__ import annotations


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """lr_t = lr · min(1, (t + 1) / W) for the t-th optimizer step (0-based), W = `warmup_steps`;
    W = 0 means no warm-up (lr_t = lr)."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)
