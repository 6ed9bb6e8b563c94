"""Rewards, log-probs and logits --> advantages and losses. Plain functions over tensors.

Every function states its formula and paper; shapes are commented. B = sequences, T = completion
tokens (right-padded, `mask` marks real tokens), V = vocabulary, G = groups, K = tasks.

Aggregation is separate from the per-token loss so that gradient accumulation is exact: each
micro-batch is normalised by the counts of the *whole* optimizer batch (`num_sequences`,
`num_tokens`), and the micro-batch losses sum to the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# --- advantages ------------------------------------------------------------------------------------


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024 "DeepSeekMath", eq. 3; Dr. GRPO when scale=False).

        Â_i = (r_i − mean_{j∈g(i)} r_j) / (std_{j∈g(i)} r_j + eps)     (scale=True, GRPO)
        Â_i =  r_i − mean_{j∈g(i)} r_j                                 (scale=False, Dr. GRPO, Liu et al. 2025)

    std is the unbiased (Bessel) sample std, as in TRL; a group of one gets Â = 0.
    rewards: (B,) float; group_index: (B,) long in [0, G). Returns (B,).
    """
    G = int(group_index.max().item()) + 1 if group_index.numel() else 0
    r = rewards.to(torch.float64)
    count = torch.zeros(G, dtype=r.dtype).index_add_(0, group_index, torch.ones_like(r))      # (G,)
    mean = torch.zeros(G, dtype=r.dtype).index_add_(0, group_index, r) / count                 # (G,)
    centred = r - mean[group_index]                                                              # (B,)
    if not scale:
        return centred.to(rewards.dtype)
    sq = torch.zeros(G, dtype=r.dtype).index_add_(0, group_index, centred**2)                  # (G,)
    std = (sq / (count - 1).clamp(min=1)).sqrt()                                                # (G,)
    return (centred / (std[group_index] + eps)).to(rewards.dtype)


def equal_reward_groups(rewards: torch.Tensor, group_index: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """DAPO dynamic sampling (Yu et al. 2025, eq. 11): groups whose rewards are all equal carry no
    signal (Â = 0) and are dropped. Returns (B,) bool, True where the sample's group is all-equal."""
    G = int(group_index.max().item()) + 1 if group_index.numel() else 0
    hi = torch.full((G,), float("-inf"), dtype=rewards.dtype).scatter_reduce(0, group_index, rewards, "amax")
    lo = torch.full((G,), float("inf"), dtype=rewards.dtype).scatter_reduce(0, group_index, rewards, "amin")
    return ((hi - lo) <= tol)[group_index]


def loo_baseline_advantages(rewards: torch.Tensor, task_index: torch.Tensor, hist_mean: torch.Tensor,
                            hist_weight: torch.Tensor) -> torch.Tensor:
    """Single-sample traffic: REINFORCE with a leave-one-out per-task baseline (RLOO, Ahmadian et al.
    2024, "Back to Basics"), where each task's history counts as `hist_weight` pseudo-samples of
    mean `hist_mean` (an EMA of past rewards):

        b_i = (w_k·m_k + Σ_{j≠i, task(j)=k} r_j) / (w_k + n_k − 1),   Â_i = r_i − b_i,   k = task(i)

    With no history and no other sample of the task (denominator 0) the baseline is 0 (plain
    REINFORCE, still unbiased). rewards: (B,); task_index: (B,) long in [0, K); hist_*: (K,).
    """
    K = hist_mean.shape[0]
    r = rewards.to(torch.float64)
    n = torch.zeros(K, dtype=r.dtype).index_add_(0, task_index, torch.ones_like(r))            # (K,)
    s = torch.zeros(K, dtype=r.dtype).index_add_(0, task_index, r)                              # (K,)
    w, m = hist_weight.to(r.dtype), hist_mean.to(r.dtype)
    num = (w * m + s)[task_index] - r                                                            # (B,)
    den = (w + n)[task_index] - 1                                                                # (B,)
    base = torch.where(den > 0, num / den.clamp(min=1e-12), torch.zeros_like(r))
    return (r - base).to(rewards.dtype)


def overlong_penalty(lengths: torch.Tensor, max_len: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward:

        R(y) = 0                              if |y| ≤ L_max − L_cache
             = ((L_max − L_cache) − |y|)/L_cache   if L_max − L_cache < |y| ≤ L_max
             = −1                             if |y| > L_max

    lengths, max_len, buffer: (B,) (buffer = L_cache in tokens; 0 disables the ramp). Returns (B,).
    """
    length, lmax, buf = lengths.to(torch.float32), max_len.to(torch.float32), buffer.to(torch.float32)
    start = lmax - buf
    ramp = (start - length) / buf.clamp(min=1e-9)
    out = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > lmax, torch.full_like(length, -1.0), out)


# --- importance sampling and KL --------------------------------------------------------------------


@dataclass
class ISStats:
    """0-d tensors (no device sync until someone reads them)."""

    capped_fraction: torch.Tensor   # share of real tokens where π_old/π_rollout > C
    max_gap: torch.Tensor           # max_t |log π_old − log π_rollout| over real tokens
    mean_weight: torch.Tensor       # mean applied (truncated) weight over real tokens
    max_weight: torch.Tensor        # largest untruncated ratio π_old/π_rollout over real tokens (1 if none)


def truncated_is_weights(logp_old: torch.Tensor, logp_behaviour: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> tuple[torch.Tensor, ISStats]:
    """Truncated importance sampling for the rollout/trainer mismatch (Yao et al. 2025, "Your efficient
    RL framework secretly brings you off-policy RL training"; docs/architecture.md §7):

        w_t = min(π_old(y_t) / π_rollout(y_t), C)

    π_rollout is the behaviour log-prob recorded by inference at temperature 1 (`response_logprobs_t1`).
    logp_*: (B, T); mask: (B, T) {0,1}. Returns detached w (B, T) (1 on padding) and stats.
    """
    with torch.no_grad():
        gap = (logp_old - logp_behaviour) * mask                                                 # (B, T)
        ratio = torch.exp(gap.clamp(max=20.0))
        w = torch.where(mask > 0, ratio.clamp(max=cap), torch.ones_like(ratio))
        mean_w, max_w, capped = is_weight_stats(ratio, mask, cap)
        stats = ISStats(capped_fraction=capped, max_gap=gap.abs().amax() if gap.numel() else gap.new_zeros(()),
                        mean_weight=mean_w, max_weight=max_w)
    return w, stats


def is_weight_stats(ratio: torch.Tensor, mask: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """How far off-policy a batch is, from the untruncated ratios ρ_t = π_old(y_t)/π_rollout(y_t) over
    the N real tokens (mask = 1):

        mean = (1/N) Σ_t min(ρ_t, C)      (the weight the loss applies)
        max  = max_t ρ_t                  (before truncation: how far the worst token was off)
        clipped = (1/N) Σ_t [ρ_t > C]     (share of tokens whose weight the cap changed)

    All 1.0 / 1.0 / 0.0 on a batch without real tokens (no correction happened). ratio, mask: (B, T).
    Returns three 0-d tensors (mean, max, clipped)."""
    with torch.no_grad():
        real = mask > 0
        n = real.sum().clamp(min=1)
        mean = torch.where(real, ratio.clamp(max=cap), torch.zeros_like(ratio)).sum() / n
        if ratio.numel() == 0:
            return ratio.new_ones(()), ratio.new_ones(()), ratio.new_zeros(())
        any_real = real.any()                                  # tensors only: no device sync per micro-batch
        top = torch.where(real, ratio, torch.full_like(ratio, float("-inf"))).amax()
        mean = torch.where(any_real, mean, torch.ones_like(mean))
        return mean, torch.where(any_real, top, torch.ones_like(top)), (ratio > cap).logical_and(real).sum() / n


def stale_fraction(staleness: torch.Tensor) -> torch.Tensor:
    """Share of samples produced by an older policy version than the one being trained:
    (1/B) Σ_i [staleness_i > 0], staleness in policy versions behind (0 = on-policy). (B,) -> 0-d
    (0 on an empty batch)."""
    if staleness.numel() == 0:
        return torch.zeros(())
    return (staleness > 0).float().mean()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate k3 (Schulman 2020, "Approximating KL divergence"), used in
    the loss by DeepSeekMath's GRPO: with δ = log π_ref − log π_θ,

        k3 = exp(δ) − δ − 1   (≥ 0, unbiased under samples of π_θ, low variance)

    (B, T) -> (B, T). Its gradient flows through logp; ref_logp is a constant."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def kl_k1_reward(rewards: torch.Tensor, logp_old: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                 beta: float) -> torch.Tensor:
    """KL folded into the reward (the PPO-RLHF form, Ouyang et al. 2022) with the k1 estimator:

        r'_i = r_i − β · Σ_t (log π_old(y_t) − log π_ref(y_t))

    No gradient flows through it; it shapes advantages instead. rewards: (B,); logps, mask: (B, T)."""
    with torch.no_grad():
        return rewards - beta * ((logp_old - ref_logp) * mask).sum(-1)


# --- policy losses ---------------------------------------------------------------------------------


@dataclass
class PolicyLossOut:
    per_token: torch.Tensor      # (B, T) loss per token (token level) or (B, 1) per sequence (GSPO)
    clip_fraction: torch.Tensor  # scalar: share of real tokens (or sequences) where the clip is active
    ratio_mean: torch.Tensor     # scalar


def clipped_policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, *, eps_low: float, eps_high: float, level: str = "token",
                        is_weights: torch.Tensor | None = None) -> PolicyLossOut:
    """PPO-clip surrogate (Schulman et al. 2017) as used by GRPO / Dr. GRPO / DAPO (token level) and GSPO
    (sequence level, Zheng et al. 2025):

        token:    ρ_t = exp(log π_θ(y_t) − log π_old(y_t))
        sequence: s_i = exp( (1/|y_i|) Σ_t (log π_θ(y_t) − log π_old(y_t)) )       (GSPO eq. 7)
        ℓ = −w · min(ρ·Â, clip(ρ, 1 − ε_low, 1 + ε_high)·Â)

    DAPO's clip-higher is ε_high > ε_low. `is_weights` w (B, T), detached, is the truncated IS
    correction; at sequence level its per-sequence geometric mean is used.
    logp, logp_old, mask: (B, T); advantages: (B,). Returns per-token (B, T) or per-sequence (B, 1) loss.
    """
    adv = advantages.unsqueeze(1)                                                               # (B, 1)
    log_ratio = (logp - logp_old) * mask                                                         # (B, T)
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)                                            # (B, 1)
    if level == "token":
        ratio = torch.exp(log_ratio)                                                             # (B, T)
        weights = is_weights if is_weights is not None else torch.ones_like(ratio)
        valid = mask
    elif level == "sequence":
        ratio = torch.exp(log_ratio.sum(-1, keepdim=True) / lengths)                             # (B, 1)
        if is_weights is not None:
            weights = torch.exp((torch.log(is_weights) * mask).sum(-1, keepdim=True) / lengths)  # (B, 1)
        else:
            weights = torch.ones_like(ratio)
        valid = (mask.sum(-1, keepdim=True) > 0).to(mask.dtype)                                  # (B, 1)
    else:
        raise ValueError(f"unknown importance level {level!r} (use 'token' or 'sequence')")
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    surrogate = torch.min(ratio * adv, clipped * adv)
    per = -weights * surrogate * valid
    with torch.no_grad():
        active = ((ratio * adv) > (clipped * adv)) & (valid > 0)
        nvalid = valid.sum().clamp(min=1)
        clip_fraction = active.sum() / nvalid
        ratio_mean = (ratio * valid).sum() / nvalid
    return PolicyLossOut(per_token=per, clip_fraction=clip_fraction, ratio_mean=ratio_mean)


def model_token_mask(completion_mask: torch.Tensor, environment: torch.Tensor) -> torch.Tensor:
    """Agent trajectories (docs/agents.md, "Agent trajectories"): the tokens the loss may see.

        m_t = mask_t · (1 − env_t)

    env_t = 1 on environment tokens (tool results, later user turns, template text between turns), which
    the policy did not sample: no ratio, no clip, no gradient, no count in any normaliser.
    completion_mask, environment: (B, T) {0, 1}. Returns (B, T) in completion_mask's dtype."""
    return completion_mask * (1 - environment.to(completion_mask.dtype))


def trajectory_grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, logp_behaviour: torch.Tensor,
                         advantages: torch.Tensor, completion_mask: torch.Tensor, environment: torch.Tensor, *,
                         eps_low: float, eps_high: float, is_cap: float) -> torch.Tensor:
    """GRPO over multi-turn trajectories whose completions interleave the policy's tokens with the
    environment's, for one batch (B sequences): with m = model_token_mask(mask, env),

        ρ_t = exp(log π_θ(y_t) − log π_old(y_t)),   w_t = min(π_old(y_t) / π_rollout(y_t), C)
        L = (1/B) Σ_i (1/Σ_t m_it) Σ_t m_it · −w_t · min(ρ_t·Â_i, clip(ρ_t, 1−ε_low, 1+ε_high)·Â_i)

    Importance ratios and weights exist only where m = 1 (the policy's own tokens, whose behaviour
    log-probs inference recorded); the trajectory's reward-derived advantage Â_i is shared by all of its
    model tokens. This is what `rl.rl_round` computes for the token-level algorithms with
    seq_mean_token_mean aggregation, written out in one function so the mask's role can be checked by hand
    (tests/unit/trainer/test_trajectory_loss.py). All (B, T) but advantages (B,)."""
    m = model_token_mask(completion_mask, environment)
    w, _ = truncated_is_weights(logp_old, logp_behaviour, m, is_cap)
    pl = clipped_policy_loss(logp, logp_old, advantages, m, eps_low=eps_low, eps_high=eps_high, is_weights=w)
    return aggregate_loss(pl.per_token, m, "seq_mean_token_mean", num_sequences=logp.shape[0],
                          num_tokens=int(m.sum()))


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, num_sequences: int,
                   num_tokens: int, const_len: int = 1) -> torch.Tensor:
    """Per-token (or per-sequence) losses of a micro-batch --> its share of the batch loss.

        seq_mean_token_mean (GRPO):  (1/N_seq) Σ_i (1/|y_i|) Σ_t ℓ_it
        token_mean (DAPO, OEL):      (1/N_tok) Σ_i Σ_t ℓ_it            (long answers weigh per token)
        constant (Dr. GRPO):         (1/(N_seq·L)) Σ_i Σ_t ℓ_it         (no length bias; L constant)
        sequence (GSPO):             (1/N_seq) Σ_i ℓ_i                  (per_token is (B, 1))

    N_seq and N_tok count the whole optimizer batch, so summing micro-batches gives the batch loss.
    """
    if mode == "sequence":
        assert per_token.shape[-1] == 1, "sequence aggregation takes per-sequence losses (B, 1)"
        return per_token.sum() / max(num_sequences, 1)
    if mode == "seq_mean_token_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / max(num_sequences, 1)
    if mode == "token_mean":
        return (per_token * mask).sum() / max(num_tokens, 1)
    if mode == "constant":
        return (per_token * mask).sum() / (max(num_sequences, 1) * const_len)
    raise ValueError(f"unknown aggregation {mode!r}")


# --- distillation (OEL consolidation, GKD, SFT) ------------------------------------------------------


def topk_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """OEL consolidation objective per token (Online Experiential Learning, arXiv 2603.16856; docs/architecture.md
    §7): reverse KL restricted to the student's top-k tokens,

        D_t = Σ_{v ∈ top-k(π_θ)} π_θ(v) · (log π_θ(v) − log π_T(v))

    with π_θ, π_T full-vocabulary softmaxes (not renormalised over the top-k). The top-k set is a
    constant for the gradient. Reference implementation over materialised logits; the trainer uses
    `logprobs.fused_topk_kl` (chunked, same value and gradient). logits: (N, V) -> (N,).
    """
    ls = torch.log_softmax(student_logits.float(), dim=-1)                                      # (N, V)
    lt = torch.log_softmax(teacher_logits.float(), dim=-1)                                      # (N, V)
    idx = ls.detach().topk(min(k, ls.shape[-1]), dim=-1).indices                                # (N, k)
    ls_k, lt_k = ls.gather(-1, idx), lt.gather(-1, idx)                                          # (N, k)
    return (ls_k.exp() * (ls_k - lt_k)).sum(-1)


def topk_forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """Forward KL over the teacher's top-k tokens, for sequences sampled from the teacher (the GKD
    mixture, Agarwal et al. 2024 "On-policy distillation of language models", with λ = share of
    teacher-sampled sequences):

        D_t = Σ_{v ∈ top-k(π_T)} π_T(v) · (log π_T(v) − log π_θ(v))

    logits: (N, V) -> (N,)."""
    ls = torch.log_softmax(student_logits.float(), dim=-1)
    lt = torch.log_softmax(teacher_logits.float(), dim=-1)
    idx = lt.topk(min(k, lt.shape[-1]), dim=-1).indices
    ls_k, lt_k = ls.gather(-1, idx), lt.gather(-1, idx)
    return (lt_k.exp() * (lt_k - ls_k)).sum(-1)


def full_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary reverse KL per token, Σ_v π_θ(v)(log π_θ(v) − log π_T(v)) (the straightforward
    implementation that the distillation benchmark compares against). (N, V) -> (N,)."""
    ls = torch.log_softmax(student_logits.float(), dim=-1)
    lt = torch.log_softmax(teacher_logits.float(), dim=-1)
    return (ls.exp() * (ls - lt)).sum(-1)


def token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: int | None = None) -> torch.Tensor:
    """(1/N_tok) Σ_t values_t over real tokens (OEL's token-mean). values, mask: (B, T) or (N,)."""
    n = num_tokens if num_tokens is not None else mask.sum().clamp(min=1)
    return (values * mask).sum() / n


def sft_nll(logp: torch.Tensor, mask: torch.Tensor, num_tokens: int | None = None) -> torch.Tensor:
    """Supervised targets (grader-filtered teacher samples): token-mean negative log-likelihood,
    −(1/N_tok) Σ_t log π_θ(y_t). logp, mask: (B, T)."""
    return token_mean(-logp, mask, num_tokens)


def masked_stats(x: torch.Tensor) -> dict[str, float]:
    """mean / std / min / max of a 1-D tensor, for metrics (NaN-free on empty input)."""
    if x.numel() == 0:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    x = x.detach().float()
    return {"mean": float(x.mean()), "std": float(x.std(unbiased=False)), "min": float(x.min()),
            "max": float(x.max())}
