"""GRPO over an agent trajectory: environment tokens (tool results, later user turns) are out of the loss,
its importance ratios and its normalisers (services/trainer/losses.py `trajectory_grpo_loss`), checked
against a hand computation; and a graded trajectory becomes a Rollout whose environment flags cover exactly
the tokens between the model's turns (services/trainer/rollouts.py)."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer import losses
from services.trainer.rollouts import MalformedRollout, from_graded
from shared.proto.apprentice.v1 import events_pb2


def test_environment_tokens_are_masked_out_of_the_loss_by_hand() -> None:
    """One trajectory, 4 completion tokens: model, tool result, tool result, model. Â = 2, ε = 0.2, C = 1.5.

    t0: ρ = 1.5 -> clipped at 1.2: min(3.0, 2.4) = 2.4; w = min(π_old/π_rollout = 2, 1.5) = 1.5 -> ℓ = -3.6
    t3: ρ = 0.9: min(1.8, 1.8) = 1.8; w = 1 -> ℓ = -1.8
    L = (1/1)(1/2)(-3.6 - 1.8) = -2.7, whatever the environment tokens' log-probs say.
    dL/dlogp: t0 clipped -> 0; t3 -> -w·ρ·Â/2 = -0.9; environment tokens -> 0.
    """
    logp_old = torch.tensor([[-1.0, -2.0, -3.0, -1.5]])
    logp = (logp_old + torch.tensor([[math.log(1.5), 5.0, -7.0, math.log(0.9)]])).requires_grad_()
    behaviour = logp_old - torch.tensor([[math.log(2.0), 40.0, -40.0, 0.0]])
    mask = torch.ones(1, 4)
    env = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    loss = losses.trajectory_grpo_loss(logp, logp_old, behaviour, torch.tensor([2.0]), mask, env,
                                       eps_low=0.2, eps_high=0.2, is_cap=1.5)
    assert loss.item() == pytest.approx(-2.7, abs=1e-5)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, 0.0, -0.9], abs=1e-5)
    # without the mask the environment tokens would count (and here dominate): the test can fail
    unmasked = losses.trajectory_grpo_loss(logp.detach(), logp_old, behaviour, torch.tensor([2.0]), mask,
                                           torch.zeros(1, 4), eps_low=0.2, eps_high=0.2, is_cap=1.5)
    assert unmasked.item() != pytest.approx(-2.7, abs=1e-3)


def test_model_token_mask() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])         # last position is padding
    env = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    assert losses.model_token_mask(mask, env).tolist() == [[1.0, 0.0, 1.0, 0.0]]


def _graded(traj: events_pb2.Trajectory | None, prompt: list[int]) -> events_pb2.GradedInteraction:
    it = events_pb2.Interaction(interaction_id="c", prompt_token_ids=prompt, response_token_ids=[30, 31],
                                response_logprobs_t1=[-0.3, -0.31])
    if traj is not None:
        it.trajectory.CopyFrom(traj)
    return events_pb2.GradedInteraction(interaction=it, reward=1.0, has_signal=True)


def test_graded_trajectory_becomes_one_rollout_with_environment_flags() -> None:
    traj = events_pb2.Trajectory(prompt_length=2, environment=[False, False, True, True],
                                 logprobs=[-0.1, -0.2, 0, 0], logprobs_t1=[-0.1, -0.2, 0, 0], interaction_ids=["a"])
    r = from_graded(_graded(traj, [1, 2, 10, 11, 90, 91]))
    assert r.prompt_ids == [1, 2]
    assert r.completion_ids == [10, 11, 90, 91, 30, 31]
    assert r.environment == [False, False, True, True, False, False]
    assert r.behaviour_logprobs == pytest.approx([-0.1, -0.2, 0, 0, -0.3, -0.31])
    assert r.model_tokens == 4 and r.has_behaviour
    assert r.response_length == 2        # DAPO's overlong penalty measures the last response only
    plain = from_graded(_graded(None, [1, 2]))
    assert plain.environment == [] and plain.model_tokens == 2 == plain.response_length
    bad = events_pb2.Trajectory(prompt_length=2, environment=[True], logprobs_t1=[0.0])
    with pytest.raises(MalformedRollout):
        from_graded(_graded(bad, [1, 2, 10, 11]))


def test_buffer_withdraws_the_earlier_turns_a_trajectory_holds() -> None:
    """Turn "a" (per-turn sample, pending) is part of trajectory "c": it leaves the buffer when "c" is
    accepted, and a later revision of it is skipped, so its tokens are not trained twice."""
    from services.trainer.buffer import ACCEPTED, RolloutBuffer

    buf = RolloutBuffer("default")
    first = events_pb2.GradedInteraction(
        interaction=events_pb2.Interaction(interaction_id="a", prompt_token_ids=[1, 2], response_token_ids=[10, 11],
                                           response_logprobs_t1=[-0.1, -0.2]), reward=0.5, has_signal=True, revision=1)
    assert buf.offer(first, 0.0) == ACCEPTED
    traj = events_pb2.Trajectory(prompt_length=2, environment=[False, False, True, True],
                                 logprobs=[-0.1, -0.2, 0, 0], logprobs_t1=[-0.1, -0.2, 0, 0], interaction_ids=["a"])
    assert buf.offer(_graded(traj, [1, 2, 10, 11, 90, 91]), 1.0) == ACCEPTED
    assert [r.interaction_id for r in buf.ready(2.0)] == ["c"]
    first.revision = 2
    assert buf.offer(first, 3.0) == "in_trajectory"
