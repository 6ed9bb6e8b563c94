"""Examples --> one training round, in-process: the library entry used by `apprentice demo` and by the
service loop (`apprentice serve trainer`), so both run exactly the same code.

    trainer = Trainer(TrainerSettings(...))                # loads the base model, LoRA by default
    r = trainer.rl_round(graded_or_rollouts)               # GRPO family, per settings.algorithm
    r = trainer.consolidation_round(examples, items)       # OEL consolidation, per settings.distill_method

Rounds are deterministic for a given settings.seed and inputs (seeded sampling, fixed batch order).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.trainer.distill import (
    AcceptFn,
    DistillConfig,
    DistillExample,
    consolidation_round,
    context_from_base,
    context_from_items,
    distill_step,
)
from services.trainer.drill import DrillPair, drill_plan, drill_round, excluded_questions
from services.trainer.knowledge import KnowledgeBase
from services.trainer.policy import Policy, PolicyConfig
from services.trainer.rl import RLConfig, RunningBaseline, rl_round
from services.trainer.rollouts import Rollout, admit
from services.trainer.settings import TrainerSettings
from services.trainer.steplog import StepHook
from shared.grading import load_function
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)

OEL_ALGORITHMS = {"rkl_topk": "oel", "gkd": "oel_gkd", "sft_filtered": "oel_sft", "sft_items": "oel_drill"}


@dataclass
class RoundResult:
    algorithm: str                        # grpo | dr_grpo | dapo | gspo | oel | oel_gkd | oel_sft
    metrics: dict[str, float]
    trained_ids: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.metrics.get("steps", 0))


def verifier_filter(path: str, params: dict[str, Any] | None = None) -> AcceptFn:
    """`sft_verifier` --> the SFT filter: a teacher sample becomes a target only when the verifier passes it
    (None, an exception or a falsy verdict rejects it: an unverifiable sample must not become a target)."""
    fn = load_function(path)

    def accept(ex: DistillExample, text: str) -> bool:
        try:
            return bool(fn(ex.messages, text, **(params or {})))
        except Exception:  # noqa: BLE001 - a buggy verifier rejects the sample; the round goes on
            log.warning("sft verifier %s raised", path, exc_info=True)
            return False
    return accept


class Trainer:
    """One tenant's trainable policy with its RL baseline and knowledge base."""

    def __init__(self, settings: TrainerSettings | None = None, *, model: Any = None, tokenizer: Any = None,
                 init_dir: Path | None = None) -> None:
        self.settings = s = settings or TrainerSettings()
        if s.common.torch_threads:
            torch.set_num_threads(s.common.torch_threads)
        self.policy = Policy(PolicyConfig.from_settings(s), model=model, tokenizer=tokenizer, init_dir=init_dir)
        self.rl_cfg = RLConfig.from_settings(s)
        self.distill_cfg = DistillConfig.from_settings(s)
        self.baseline = RunningBaseline(s.baseline_decay)
        self.knowledge = KnowledgeBase(s.tenant, s.knowledge_snapshots)
        self.accept = verifier_filter(s.sft_verifier, s.sft_verifier_params) if s.sft_verifier else None
        self.on_step: Callable[[str, dict[str, float]], None] | None = None
        """Called with (algorithm, metrics) after each optimizer step (the service's metrics and experiment
        log; unset on torchrun followers, so only rank 0 reports)."""
        self.staleness_of: Callable[[Rollout], float] | None = None
        """A rollout's policy-version staleness, for the step metrics (the service's buffer knows it)."""

    def _step_hook(self, algorithm: str) -> StepHook | None:
        hook = self.on_step
        if hook is None:
            return None
        return lambda metrics: hook(algorithm, metrics)

    @property
    def model(self) -> Any:
        return self.policy.model

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    def steps_left(self) -> int | None:
        """Remaining step budget (None = unlimited)."""
        if self.settings.max_steps <= 0:
            return None
        return max(0, self.settings.max_steps - self.policy.steps)

    # --- RL ---------------------------------------------------------------------------------------------
    def rl_round(self, items: Sequence[Rollout | events_pb2.GradedInteraction]) -> RoundResult:
        """GRPO-family update on graded records or on rollouts already admitted. Graded records pass the
        trainer's filter here (`admit`: other tenants', quarantined, no-signal and malformed ones are
        skipped and counted); rollouts passed it where they were made (the service's RL buffer, which
        also handles staleness, revisions and groups waiting for siblings) and are not filtered again.
        A rollout of another tenant is a caller's wiring error: it raises, and nothing is trained."""
        tenant = self.settings.tenant
        foreign = sorted({it.tenant for it in items if isinstance(it, Rollout) and it.tenant != tenant})
        if foreign:
            raise ValueError(f"rollouts of tenant(s) {', '.join(map(repr, foreign))} given to the trainer of "
                             f"tenant {tenant!r}: graded records are admitted per tenant before they train")
        rollouts: list[Rollout] = []
        skipped: dict[str, int] = {}
        for it in items:
            if isinstance(it, Rollout):
                rollouts.append(it)
                continue
            verdict = admit(it, tenant)
            if verdict.rollout is None:
                skipped[verdict.reason] = skipped.get(verdict.reason, 0) + 1
            else:
                rollouts.append(verdict.rollout)
        metrics = rl_round(self.policy, rollouts, self.rl_cfg, self.baseline, max_steps=self.steps_left(),
                           on_step=self._step_hook(self.rl_cfg.algorithm), staleness_of=self.staleness_of)
        return RoundResult(self.rl_cfg.algorithm, metrics, [r.interaction_id for r in rollouts], skipped)

    # --- OEL consolidation -------------------------------------------------------------------------------
    def consolidation_round(self, examples: Sequence[DistillExample],
                            knowledge: KnowledgeBase | Sequence[str] | None = None, *,
                            accept: AcceptFn | None = None, config: DistillConfig | None = None) -> RoundResult:
        """OEL consolidation on deployment prompts. `knowledge`: the tenant's base (default: this trainer's,
        fed from the knowledge topic) or a fixed list of item texts. `accept(example, text)` is the grader
        filter for sft_filtered (default: the `sft_verifier` setting's). The teacher is a frozen snapshot of the policy taken now (round start)."""
        s = self.settings
        cfg = config or self.distill_cfg
        kb = self.knowledge if knowledge is None else knowledge
        ctx = (context_from_base(kb, s.retrieval, s.retrieval_items) if isinstance(kb, KnowledgeBase)
               else context_from_items(list(kb), s.retrieval, s.retrieval_items))
        teacher = self.policy.snapshot()
        try:
            cfg = DistillConfig(**{**cfg.__dict__, "seed": cfg.seed + random.Random(self.policy.steps).randrange(1 << 20)})
            if cfg.method == "sft_items":
                return RoundResult(OEL_ALGORITHMS[cfg.method], self._drill(teacher, examples, kb, ctx, cfg))
            metrics = consolidation_round(self.policy, teacher, examples, ctx, cfg, accept=accept or self.accept,
                                          max_steps=self.steps_left(),
                                          on_step=self._step_hook(OEL_ALGORITHMS[cfg.method]))
        finally:
            del teacher
        return RoundResult(OEL_ALGORITHMS[cfg.method], metrics)

    def _drill(self, teacher: Any, examples: Sequence[DistillExample], kb: KnowledgeBase | Sequence[str],
               ctx: Callable[[DistillExample, random.Random], list[str]], cfg: DistillConfig) -> dict[str, float]:
        """An `sft_items` round (services/trainer/drill.py) on this tenant's items and deployment prompts."""
        plan = drill_plan(examples, kb, ctx, cfg.seed)
        policy = self.policy

        def step(rows: list[DrillPair]) -> tuple[float, float, int, float]:
            prompts = [r.prompt for r in rows]
            # replay rows are marked as the teacher's: they take the forward KL to the round-start model
            return distill_step(policy, teacher, prompts, prompts, [r.target for r in rows],
                                [r.item < 0 for r in rows], cfg, t_fused=None)

        steps_left = self.steps_left()
        if steps_left is not None:
            cfg = DistillConfig(**{**cfg.__dict__, "steps": min(cfg.steps, steps_left)})
        return drill_round(policy, teacher, plan.items, plan.asked, plan.system, cfg,
                           exclude=excluded_questions(self.settings.distill_exclude_questions), step_fn=step,
                           on_step=self._step_hook(OEL_ALGORITHMS[cfg.method]))
