"""The learning-rate warm-up: the formula by hand, the optimizer really stepping at it, and a resumed trainer
continuing the schedule instead of warming up again."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from services.trainer.policy import Policy, PolicyConfig
from services.trainer.schedule import warmup_lr


def test_warmup_by_hand() -> None:
    # W = 4: steps 0..3 run at 1/4, 2/4, 3/4, 4/4 of the rate, then the rate
    assert [warmup_lr(2e-5, t, 4) for t in range(6)] == pytest.approx([5e-6, 1e-5, 1.5e-5, 2e-5, 2e-5, 2e-5])
    assert warmup_lr(2e-5, 0, 0) == 2e-5          # no warm-up


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str) -> Any:
    from shared.models import load_model

    return load_model(tiny_model_name)


def _one_step(p: Policy) -> None:
    x = torch.tensor([[1, 2, 3, 4, 5]])
    p.model(input_ids=x).logits.float().pow(2).mean().backward()
    p.step()


def test_the_optimizer_steps_at_the_warmup_rate_and_a_resume_continues(tiny: Any, tmp_path: Any) -> None:
    model, tok = tiny
    p = Policy(PolicyConfig("tiny-random", finetune="full", lr=1e-3, warmup_steps=4, device="cpu"),
               model=copy.deepcopy(model), tokenizer=tok)
    # Adam's first step moves every weight by its step's rate (sign step): the warm-up's quarter, not the rate
    before = [q.detach().clone() for q in p.model.parameters()]
    _one_step(p)
    moved = max(float((a - q.detach()).abs().max()) for a, q in zip(before, p.model.parameters(), strict=True))
    assert p.last_lr == pytest.approx(2.5e-4) and moved == pytest.approx(2.5e-4, rel=1e-3)
    _one_step(p)
    assert p.last_lr == pytest.approx(5e-4) and p.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    p.save_training_state(tmp_path / "state.pt")
    q = Policy(PolicyConfig("tiny-random", finetune="full", lr=1e-3, warmup_steps=4, device="cpu"),
               model=copy.deepcopy(p.model), tokenizer=tok)
    q.load_training_state(tmp_path / "state.pt")
    _one_step(q)
    assert q.last_lr == pytest.approx(7.5e-4)      # step 3 of the schedule, not step 1 again
