"""Rollouts (prompt, response, reward, behaviour log-probs) --> one GRPO-family update of the policy.

A round: 1) shape rewards (DAPO overlong penalty, optional k1 KL); 2) advantages: group-relative for
exploration groups, a per-task leave-one-out running baseline for single samples; DAPO drops groups
whose rewards are all equal; 3) for each optimizer batch, micro-batches accumulate gradients of the
clipped surrogate (token- or sequence-level ratio), weighted by truncated IS against the recorded
behaviour log-probs; 4) clip and step.

π_old is the policy at the start of the round. When the round takes one optimizer step (one batch, one
epoch) it equals π_θ at that step, so it is π_θ detached (no extra forward, as in TRL); otherwise it
is recomputed once, before the first step, for every rollout.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.trainer import losses
from services.trainer.batching import SeqBatch, make_batch, micro_batches
from services.trainer.distributed import shard
from services.trainer.logprobs import score
from services.trainer.policy import Policy
from services.trainer.rollouts import Rollout
from services.trainer.steplog import StepHook
from shared.progress import progress

AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "constant", "dapo": "token_mean", "gspo": "sequence"}


@dataclass(frozen=True)
class RLConfig:
    algorithm: str = "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    scale_rewards: bool = True
    drop_equal_groups: bool = False
    overlong_buffer: float = 0.0        # fraction of L_max (DAPO: 0.2)
    max_completion_length: int = 256
    kl_beta: float = 0.0
    kl_mode: str = "k3_loss"
    is_cap: float = 2.0
    batch_size: int = 16
    micro_batch_size: int = 4
    ppo_epochs: int = 1

    def __post_init__(self) -> None:
        if self.algorithm not in AGGREGATION:
            raise ValueError(f"unknown RL algorithm {self.algorithm!r}; use one of {sorted(AGGREGATION)}")
        if self.kl_mode not in ("k3_loss", "k1_reward"):
            raise ValueError(f"unknown kl_mode {self.kl_mode!r}; use 'k3_loss' or 'k1_reward'")

    @classmethod
    def from_settings(cls, s: Any) -> RLConfig:
        low, high = s.resolved_eps
        return cls(algorithm=s.algorithm, eps_low=low, eps_high=high, scale_rewards=s.resolved_scale_rewards,
                   drop_equal_groups=s.resolved_drop_equal_groups, overlong_buffer=s.resolved_overlong_buffer,
                   max_completion_length=s.max_completion_length, kl_beta=s.kl_beta, kl_mode=s.kl_mode,
                   is_cap=s.is_cap, batch_size=s.batch_size, micro_batch_size=s.micro_batch_size,
                   ppo_epochs=s.ppo_epochs)


class RunningBaseline:
    """Per-task EMA of rewards for single-sample traffic; its weight saturates at 1/(1 − decay)."""

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.mean: dict[str, float] = {}
        self.weight: dict[str, float] = {}

    def advantages(self, rewards: torch.Tensor, tasks: Sequence[str]) -> torch.Tensor:
        names = sorted(set(tasks))
        index = torch.tensor([names.index(t) for t in tasks], dtype=torch.long)
        hm = torch.tensor([self.mean.get(t, 0.0) for t in names], dtype=torch.float64)
        hw = torch.tensor([self.weight.get(t, 0.0) for t in names], dtype=torch.float64)
        return losses.loo_baseline_advantages(rewards, index, hm, hw)

    def update(self, rewards: Sequence[float], tasks: Sequence[str]) -> None:
        cap = 1.0 / (1.0 - self.decay)
        for r, t in zip(rewards, tasks, strict=True):
            m, w = self.mean.get(t, 0.0), self.weight.get(t, 0.0)
            w_new = min(w * self.decay + 1.0, cap)
            self.mean[t] = m + (r - m) / w_new if w_new > 0 else r
            self.weight[t] = w_new

    def state(self) -> dict[str, Any]:
        return {"decay": self.decay, "mean": self.mean, "weight": self.weight}

    def load(self, state: dict[str, Any]) -> None:
        self.mean = {k: float(v) for k, v in state.get("mean", {}).items()}
        self.weight = {k: float(v) for k, v in state.get("weight", {}).items()}


def shaped_rewards(rollouts: Sequence[Rollout], cfg: RLConfig) -> torch.Tensor:
    """Raw rewards plus DAPO's soft overlong penalty when enabled. (B,)"""
    r = torch.tensor([x.reward for x in rollouts], dtype=torch.float32)
    if cfg.overlong_buffer > 0:
        lmax = torch.tensor([x.max_new_tokens or cfg.max_completion_length for x in rollouts], dtype=torch.float32)
        # the last response's length (a trajectory's earlier turns each had their own max_new_tokens)
        lengths = torch.tensor([x.response_length for x in rollouts], dtype=torch.float32)
        r = r + losses.overlong_penalty(lengths, lmax, (lmax * cfg.overlong_buffer).floor())
    return r


def compute_advantages(rollouts: Sequence[Rollout], rewards: torch.Tensor, cfg: RLConfig,
                       baseline: RunningBaseline) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(advantages (B,), keep mask (B,) bool, counts). Groups with ≥ 2 members in this round get
    group-relative advantages; every other rollout the running per-task baseline."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        if r.grouped:
            members[r.group_id].append(i)
    grouped = [i for ids in members.values() if len(ids) >= 2 for i in ids]
    single = sorted(set(range(len(rollouts))) - set(grouped))
    adv = torch.zeros(len(rollouts), dtype=torch.float32)
    keep = torch.ones(len(rollouts), dtype=torch.bool)
    dropped = 0
    if grouped:
        gids = sorted({rollouts[i].group_id for i in grouped})
        gidx = torch.tensor([gids.index(rollouts[i].group_id) for i in grouped], dtype=torch.long)
        gi = torch.tensor(grouped, dtype=torch.long)
        adv[gi] = losses.group_advantages(rewards[gi], gidx, scale=cfg.scale_rewards)
        if cfg.drop_equal_groups:
            eq = losses.equal_reward_groups(rewards[gi], gidx)
            keep[gi[eq]] = False
            dropped = int(eq.sum())
    if single:
        si = torch.tensor(single, dtype=torch.long)
        adv[si] = baseline.advantages(rewards[si], [rollouts[i].task for i in single])
    baseline.update([float(x) for x in rewards], [r.task for r in rollouts])
    counts = {"n_grouped": float(len(grouped)), "n_single": float(len(single)), "n_groups": float(len(members)),
              "n_dropped_equal": float(dropped)}
    return adv, keep, counts


def _pad(rows: Sequence[torch.Tensor], T: int) -> torch.Tensor:
    out = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        out[i, :r.shape[0]] = r
    return out


def loss_mask(b: SeqBatch, rollouts: Sequence[Rollout]) -> torch.Tensor:
    """The tokens of a micro-batch the loss sees, (B, T) on b's device: real completion tokens, less the
    environment tokens of agent trajectories (tool results, later user turns), which leave the loss, its
    importance ratios and its normalisers (losses.model_token_mask; docs/agents.md)."""
    env = _pad([torch.tensor(r.environment, dtype=torch.float32) for r in rollouts], b.completion_ids.shape[1])
    return losses.model_token_mask(b.completion_mask, env.to(b.completion_mask.device))


def _step_metrics(rollouts: Sequence[Rollout], batch: Sequence[int], rewards: torch.Tensor, sums: dict[str, Any],
                  before: dict[str, Any], tokens: int, grad_norm: float, seconds: float,
                  staleness_of: Callable[[Rollout], float] | None, is_weight_max: float = 1.0) -> dict[str, float]:
    """One optimizer step's metrics from the round's running sums (the step's share: sums - before).
    The off-policy view of the step: `staleness` (mean policy versions behind), `stale_fraction` (share
    of its samples from an older policy version) and the truncated-IS weights' mean, max (untruncated)
    and clipped share (`is_capped_fraction`), all from losses.is_weight_stats / stale_fraction."""
    ntok = max(tokens, 1)

    def step_sum(key: str) -> float:
        return float(sums.get(key, 0.0)) - float(before.get(key, 0.0))

    rw = losses.masked_stats(rewards[torch.tensor(list(batch), dtype=torch.long)])
    out = {"loss": step_sum("loss"), "kl": step_sum("kl_old") / ntok, "clip_fraction": step_sum("clip_fraction") / ntok,
           "is_capped_fraction": step_sum("is_capped_fraction") / ntok, "grad_norm": grad_norm,
           "is_weight_mean": step_sum("is_weight_mean") / ntok if tokens else 1.0, "is_weight_max": is_weight_max,
           "reward_mean": rw["mean"], "reward_std": rw["std"], "tokens": float(tokens), "seconds": seconds,
           "tokens_per_s": tokens / max(seconds, 1e-9),
           "response_length": sum(len(rollouts[i].completion_ids) for i in batch) / max(len(batch), 1)}
    if "kl_ref" in sums:
        out["kl_ref"] = step_sum("kl_ref") / ntok
    if staleness_of is not None and batch:
        stale = torch.tensor([staleness_of(rollouts[i]) for i in batch], dtype=torch.float32)
        out["staleness"] = float(stale.mean())
        out["stale_fraction"] = float(losses.stale_fraction(stale))
    return out


def rl_round(policy: Policy, rollouts: Sequence[Rollout], cfg: RLConfig, baseline: RunningBaseline, *,
             max_steps: int | None = None, on_step: StepHook | None = None,
             staleness_of: Callable[[Rollout], float] | None = None) -> dict[str, float]:
    """Train on `rollouts` (any order; groups are recognised by group_id). Returns metrics.
    `max_steps` bounds the optimizer steps taken (the step budget). `on_step` receives each optimizer
    step's own metrics (what dashboards and experiment logs plot; costs one device sync per step);
    `staleness_of` gives a rollout's policy-version staleness for them."""
    t0 = time.perf_counter()
    rollouts = list(rollouts)
    if not rollouts:
        return {"n_rollouts": 0.0, "steps": 0.0}
    dev = policy.device
    level = "sequence" if cfg.algorithm == "gspo" else "token"
    mode = AGGREGATION[cfg.algorithm]
    n_opt_batches = math.ceil(len(rollouts) / cfg.batch_size)
    need_old = n_opt_batches * cfg.ppo_epochs > 1 or (cfg.kl_beta > 0 and cfg.kl_mode == "k1_reward")
    need_ref = cfg.kl_beta > 0

    # 1) frozen views (π_old, π_ref) per rollout, when needed, before any update
    def frozen_logps(model_ctx: Any) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [torch.empty(0)] * len(rollouts)
        with model_ctx as m, policy.autocast():
            for mb in micro_batches([len(r.completion_ids) for r in rollouts], cfg.micro_batch_size):
                b = make_batch([rollouts[i].prompt_ids for i in mb], [rollouts[i].completion_ids for i in mb],
                               policy.pad_id).to(dev)
                lp = score(m, b, policy.scorer.chunk).float().cpu()
                for j, i in enumerate(mb):
                    out[i] = lp[j, :len(rollouts[i].completion_ids)]
        return out

    was_training = policy.model.training
    policy.model.eval()
    old = frozen_logps(contextlib.nullcontext(policy.model)) if need_old else None
    ref = frozen_logps(policy.reference()) if need_ref else None
    if was_training:
        policy.model.train()

    # 2) rewards and advantages
    rewards = shaped_rewards(rollouts, cfg)
    if need_ref and cfg.kl_mode == "k1_reward":
        assert old is not None and ref is not None
        T = max(len(r.completion_ids) for r in rollouts)
        mask = _pad([1 - torch.tensor(r.environment or [False] * len(r.completion_ids), dtype=torch.float32)
                     for r in rollouts], T)
        rewards = losses.kl_k1_reward(rewards, _pad(old, T), _pad(ref, T), mask, cfg.kl_beta)
    adv, keep, counts = compute_advantages(rollouts, rewards, cfg, baseline)
    kept = [i for i in range(len(rollouts)) if keep[i]]

    # 3) optimizer batches of micro-batches
    sums: dict[str, Any] = defaultdict(float)      # device tensors while training: no sync per micro-batch
    tokens = 0
    norms: list[float] = []
    steps = 0
    is_missing = sum(1 for i in kept if not rollouts[i].has_behaviour)
    planned = cfg.ppo_epochs * -(-len(kept) // cfg.batch_size)
    bar = progress(total=planned if max_steps is None else min(planned, max_steps), desc="RL steps", unit="step",
                   leave=False)  # a terminal only (shared/progress.py)
    for _epoch in range(cfg.ppo_epochs):
        for s in range(0, len(kept), cfg.batch_size):
            if max_steps is not None and steps >= max_steps:
                break
            ob = kept[s:s + cfg.batch_size]
            n_seq, n_tok = len(ob), sum(rollouts[i].model_tokens for i in ob)          # batch-wide normalisers
            step_t0, tokens_before = time.perf_counter(), tokens
            before = ({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sums.items()}  # += is in place
                      if on_step is not None else {})
            step_w_max: Any = 0.0                                                      # this step's largest IS ratio
            mine = shard(ob)                                                           # torchrun: this rank's share
            for mb_local in micro_batches([len(rollouts[i].completion_ids) for i in mine], cfg.micro_batch_size):
                mb = [mine[j] for j in mb_local]
                rs = [rollouts[i] for i in mb]
                b = make_batch([r.prompt_ids for r in rs], [r.completion_ids for r in rs], policy.pad_id).to(dev)
                T, mask = b.completion_ids.shape[1], loss_mask(b, rs)
                with policy.autocast():
                    lp = b.unflatten(policy.scorer(b).float())                                      # (B, T)
                lp_old = _pad([old[i] for i in mb], T).to(dev) if old is not None else lp.detach()
                has = torch.tensor([r.has_behaviour for r in rs], device=dev)[:, None]                # (B, 1)
                recorded = _pad([torch.tensor(r.behaviour_logprobs if r.has_behaviour else []) for r in rs], T)
                behaviour = torch.where(has, recorded.to(dev), lp_old)          # missing: w = 1 (no correction)
                w, st = losses.truncated_is_weights(lp_old, behaviour, mask, cfg.is_cap)
                pl = losses.clipped_policy_loss(lp, lp_old, adv[mb].to(dev), mask, eps_low=cfg.eps_low,
                                                eps_high=cfg.eps_high, level=level, is_weights=w)
                loss = losses.aggregate_loss(pl.per_token, mask, mode, num_sequences=n_seq, num_tokens=n_tok,
                                             const_len=cfg.max_completion_length)
                if ref is not None:
                    kl = losses.kl_k3(lp, _pad([ref[i] for i in mb], T).to(dev)) * mask
                    sums["kl_ref"] += kl.sum().detach()
                    if cfg.kl_mode == "k3_loss":
                        kl_mode = "seq_mean_token_mean" if mode == "sequence" else mode
                        loss = loss + cfg.kl_beta * losses.aggregate_loss(
                            kl, mask, kl_mode, num_sequences=n_seq, num_tokens=n_tok, const_len=cfg.max_completion_length)
                loss.backward()
                ntok = sum(r.model_tokens for r in rs)
                tokens += ntok
                sums["loss"] += loss.detach()
                sums["clip_fraction"] += pl.clip_fraction * ntok
                sums["ratio_mean"] += pl.ratio_mean * ntok
                sums["is_capped_fraction"] += st.capped_fraction * ntok
                sums["is_weight_mean"] += st.mean_weight * ntok
                step_w_max = torch.maximum(torch.as_tensor(step_w_max, device=dev), st.max_weight)
                sums["is_max_gap"] = torch.maximum(torch.as_tensor(sums["is_max_gap"], device=dev), st.max_gap)
                sums["kl_old"] += ((lp_old - lp.detach()) * mask).sum()
            norms.append(policy.step())
            steps += 1
            sums["is_weight_max"] = torch.maximum(torch.as_tensor(sums["is_weight_max"], device=dev),
                                                  torch.as_tensor(step_w_max, device=dev))
            bar.update()
            if on_step is not None:
                on_step({**_step_metrics(rollouts, ob, rewards, sums, before, tokens - tokens_before,
                                         norms[-1], time.perf_counter() - step_t0, staleness_of,
                                         float(step_w_max)), "lr": policy.last_lr})
    bar.close()
    sums = defaultdict(float, {k: float(v) for k, v in sums.items()})     # one sync, after the round
    elapsed = time.perf_counter() - t0
    ntok = max(tokens, 1)
    a = losses.masked_stats(adv[kept]) if kept else losses.masked_stats(torch.empty(0))
    rw = losses.masked_stats(rewards)
    metrics = {
        "loss": sums["loss"] / max(steps, 1), "clip_fraction": sums["clip_fraction"] / ntok,
        "ratio_mean": sums["ratio_mean"] / ntok, "is_capped_fraction": sums["is_capped_fraction"] / ntok,
        "is_weight_mean": sums["is_weight_mean"] / ntok if tokens else 1.0,
        "is_weight_max": sums["is_weight_max"] if steps else 1.0,
        "is_max_gap": sums["is_max_gap"], "is_missing": float(is_missing), "kl_old": sums["kl_old"] / ntok,
        "reward_mean": rw["mean"], "reward_std": rw["std"], "adv_mean": a["mean"], "adv_std": a["std"],
        "adv_min": a["min"], "adv_max": a["max"], "grad_norm": sum(norms) / max(len(norms), 1),
        "grad_norm_max": max(norms, default=0.0), "tokens": float(tokens), "tokens_per_s": tokens / max(elapsed, 1e-9),
        "n_rollouts": float(len(rollouts)), "n_trained": float(len(kept)), "steps": float(steps),
        "seconds": elapsed, **counts,
    }
    if ref is not None:
        metrics["kl_ref"] = sums["kl_ref"] / ntok
    return metrics
