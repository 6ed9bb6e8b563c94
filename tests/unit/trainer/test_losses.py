"""Each loss and estimator against numbers computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer import losses

A = pytest.approx


def test_group_advantages_grpo_and_dr_grpo() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean .5, centred ±.5, unbiased var = 4·.25/3 = 1/3, std = .57735; group 1: all equal -> 0
    adv = losses.group_advantages(r, g, scale=True, eps=1e-4)
    s = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert adv.tolist() == A([s, -s, -s, s, 0.0, 0.0], abs=1e-6)
    assert losses.group_advantages(r, g, scale=False).tolist() == A([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])


def test_equal_reward_groups_dynamic_sampling() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 0.5])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    assert losses.equal_reward_groups(r, g).tolist() == [False] * 4 + [True, True, True]


def test_loo_baseline_advantages() -> None:
    r = torch.tensor([1.0, 0.0, 0.5])
    tasks = torch.tensor([0, 0, 1])
    hm, hw = torch.tensor([0.2, 0.0]), torch.tensor([2.0, 0.0])
    # i=0: b = (2·.2 + (1+0) − 1)/(2 + 2 − 1) = .4/3      -> A = 1 − .13333
    # i=1: b = (.4 + 1 − 0)/3 = 1.4/3                      -> A = −.46667
    # i=2: no history, alone: denominator 0 -> b = 0       -> A = .5
    adv = losses.loo_baseline_advantages(r, tasks, hm, hw)
    assert adv.tolist() == A([1 - 0.4 / 3, -1.4 / 3, 0.5], abs=1e-6)


def test_overlong_penalty() -> None:
    L = torch.tensor([5, 6, 7, 8, 10, 11])
    # L_max 10, L_cache 4: free up to 6, ramp (6 − L)/4 to 10, −1 beyond
    out = losses.overlong_penalty(L, torch.full((6,), 10), torch.full((6,), 4))
    assert out.tolist() == A([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])


def test_truncated_is_weights() -> None:
    old = torch.log(torch.tensor([[0.5, 0.4], [0.9, 0.7]]))
    beh = torch.log(torch.tensor([[0.25, 0.4], [0.3, 0.1]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w, st = losses.truncated_is_weights(old, beh, mask, cap=2.0)
    # ratios 2, 1, 3 (and 7 on padding, ignored) -> min(·, 2) = 2, 1, 2; 1 on padding
    assert w.tolist() == [A([2.0, 1.0]), A([2.0, 1.0])]
    assert float(st.capped_fraction) == A(1 / 3)   # only 3 > 2 (2 is not above the cap)
    assert float(st.max_gap) == A(math.log(3))
    assert float(st.mean_weight) == A(5 / 3)
    assert float(st.max_weight) == A(3.0)           # untruncated: how far the worst token was off


def test_is_weight_stats_by_hand() -> None:
    ratio = torch.tensor([[0.5, 4.0, 9.0], [1.0, 2.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])   # the 9 is padding
    mean, top, clipped = losses.is_weight_stats(ratio, mask, cap=2.0)
    # real ratios .5, 4, 1, 2, 1 -> truncated .5, 2, 1, 2, 1: mean 6.5/5; max 4 (untruncated); only 4 > 2
    assert float(mean) == A(6.5 / 5)
    assert float(top) == A(4.0)
    assert float(clipped) == A(1 / 5)
    # no real token: no correction happened
    none = losses.is_weight_stats(ratio, torch.zeros_like(mask), cap=2.0)
    assert [float(x) for x in none] == [1.0, 1.0, 0.0]


def test_stale_fraction_by_hand() -> None:
    assert float(losses.stale_fraction(torch.tensor([0.0, 2.0, 0.0, 1.0]))) == A(0.5)
    assert float(losses.stale_fraction(torch.tensor([0.0, 0.0]))) == 0.0
    assert float(losses.stale_fraction(torch.empty(0))) == 0.0


def test_kl_estimators() -> None:
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    # δ = log(.25/.5) = −ln 2: k3 = e^δ − δ − 1 = .5 + .693147 − 1
    assert losses.kl_k3(lp, ref).item() == A(0.5 + math.log(2) - 1)
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    ref2 = torch.log(torch.tensor([[0.25, 0.5]]))
    # r − β Σ_t (log π_old − log π_ref) = 1 − .1·(ln 2 + 0)
    out = losses.kl_k1_reward(torch.tensor([1.0]), old, ref2, torch.ones(1, 2), beta=0.1)
    assert out.item() == A(1 - 0.1 * math.log(2))


def _ratios_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.zeros(2, 2)
    lp = torch.log(torch.tensor([[1.5, 0.9], [0.5, 1.1]]))   # ρ = exp(lp − old)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])             # sequence 1 has one real token
    return lp, old, adv, mask


def test_clipped_policy_loss_token_level_dapo_clip_higher() -> None:
    lp, old, adv, mask = _ratios_case()
    out = losses.clipped_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # seq 0, A=+1: ρ 1.5 -> min(1.5, 1.28) = 1.28 (clipped); ρ .9 -> .9
    # seq 1, A=−1: ρ .5 -> min(−.5, −.8) = −.8 (clipped); token 2 is padding
    assert out.per_token.tolist() == [A([-1.28, -0.9]), A([0.8, 0.0])]
    assert out.clip_fraction.item() == A(2 / 3)
    # GRPO: mean over sequences of per-sequence token means: ((−1.28 − .9)/2 + .8/1)/2 = −.145
    g = losses.aggregate_loss(out.per_token, mask, "seq_mean_token_mean", num_sequences=2, num_tokens=3)
    assert g.item() == A(-0.145)
    # DAPO token-level: (−1.28 − .9 + .8)/3 = −.46
    d = losses.aggregate_loss(out.per_token, mask, "token_mean", num_sequences=2, num_tokens=3)
    assert d.item() == A(-0.46)
    # Dr. GRPO constant normaliser L = 4: −1.38/(2·4) = −.1725
    c = losses.aggregate_loss(out.per_token, mask, "constant", num_sequences=2, num_tokens=3, const_len=4)
    assert c.item() == A(-0.1725)


def test_clipped_policy_loss_is_weights_scale_tokens() -> None:
    lp, old, adv, mask = _ratios_case()
    w = torch.tensor([[2.0, 1.0], [0.5, 1.0]])
    out = losses.clipped_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, is_weights=w)
    # ρ 1.5 clipped to 1.2 (symmetric ε) × w 2 = −2.4; .9 × 1 = −.9; .8 × .5 = .4
    assert out.per_token.tolist() == [A([-2.4, -0.9]), A([0.4, 0.0])]


def test_gspo_sequence_ratio() -> None:
    lp, old, adv, mask = _ratios_case()
    out = losses.clipped_policy_loss(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4, level="sequence")
    # s_0 = exp((ln 1.5 + ln .9)/2) = √1.35 = 1.1619 -> clipped 1.0004 -> −1.0004
    # s_1 = exp(ln .5 / 1) = .5, A = −1: min(−.5, −.9997) = −.9997 -> +.9997
    assert out.per_token.shape == (2, 1)
    assert out.per_token[:, 0].tolist() == A([-1.0004, 0.9997], abs=1e-6)
    agg = losses.aggregate_loss(out.per_token, mask, "sequence", num_sequences=2, num_tokens=3)
    assert agg.item() == A((-1.0004 + 0.9997) / 2, abs=1e-6)
    assert out.clip_fraction.item() == A(1.0)


def test_aggregation_sums_over_micro_batches() -> None:
    """Gradient accumulation is exact: micro-batch losses normalised by batch counts sum to the batch loss."""
    torch.manual_seed(0)
    per, mask = torch.randn(4, 5), (torch.rand(4, 5) > 0.3).float()
    for mode in ("seq_mean_token_mean", "token_mean", "constant"):
        whole = losses.aggregate_loss(per, mask, mode, num_sequences=4, num_tokens=int(mask.sum()), const_len=5)
        parts = sum(losses.aggregate_loss(per[i:i + 2], mask[i:i + 2], mode, num_sequences=4,
                                          num_tokens=int(mask.sum()), const_len=5) for i in (0, 2))
        assert float(parts) == A(float(whole), abs=1e-6)


def test_topk_kl_hand_case() -> None:
    s = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    t = torch.log(torch.tensor([[0.2, 0.3, 0.5]]))
    # student top-2 = {0, 1}: .5·ln(.5/.2) + .3·ln(.3/.3) = .5·ln 2.5
    assert losses.topk_reverse_kl(s, t, 2).item() == A(0.5 * math.log(2.5))
    # full: + .2·ln(.2/.5)
    assert losses.full_reverse_kl(s, t).item() == A(0.5 * math.log(2.5) + 0.2 * math.log(0.4))
    # teacher top-2 = {2, 1}: .5·ln(.5/.2) + 0
    assert losses.topk_forward_kl(s, t, 2).item() == A(0.5 * math.log(2.5))
    # k = V is the full reverse KL
    assert losses.topk_reverse_kl(s, t, 3).item() == A(losses.full_reverse_kl(s, t).item())


def test_topk_reverse_kl_against_brute_force() -> None:
    torch.manual_seed(1)
    s, t = torch.randn(6, 50) * 3, torch.randn(6, 50) * 3
    got = losses.topk_reverse_kl(s, t, 7)
    for n in range(6):
        p = [math.exp(x) for x in s[n].tolist()]
        q = [math.exp(x) for x in t[n].tolist()]
        zp, zq = sum(p), sum(q)
        top = sorted(range(50), key=lambda v: -p[v])[:7]
        want = sum(p[v] / zp * (math.log(p[v] / zp) - math.log(q[v] / zq)) for v in top)
        assert got[n].item() == A(want, rel=1e-5)


def test_sft_nll_and_token_mean() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.25], [1.0, 0.1]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # −(ln .5 + ln .25 + ln 1)/3 = 3 ln 2 / 3
    assert losses.sft_nll(lp, mask).item() == A(math.log(2))
