"""Trainer settings, from `APPRENTICE_TRAINER_*` environment variables (no torch import here).

Grouped like TRL's `GRPOConfig`: what to read, the RL objective, OEL consolidation, optimisation,
schedule, checkpoints. Every default says why; `resolved_*` properties fill the algorithm-dependent
defaults (clip-higher for DAPO, std scaling for GRPO, ...) in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, Tag, model_validator
from pydantic_settings import SettingsConfigDict

from shared.settings import ApprenticeSettings, CommonSettings, Group, kind_discriminator

Algorithm = Literal["grpo", "dr_grpo", "dapo", "gspo"]
DistillMethod = Literal["rkl_topk", "gkd", "sft_filtered", "sft_items"]
KLMode = Literal["k3_loss", "k1_reward"]


class NoLogSettings(Group):
    """No experiment log (Prometheus still gets every step)."""

    kind: Literal["none"] = "none"
    """`none`, `tensorboard`, `wandb` or `jsonl`: where the per-step metrics go besides Prometheus."""


class _LogFiles(Group):
    dir: Path | None = None
    """Where the experiment log writes (TRL's `logging_dir`); None = `<state_dir>/runs`."""


class TensorBoardSettings(_LogFiles):
    """TensorBoard event files (the `tensorboard` extra)."""

    kind: Literal["tensorboard"]
    """`none`, `tensorboard`, `wandb` or `jsonl`: where the per-step metrics go besides Prometheus."""


class WandbSettings(_LogFiles):
    """Weights & Biases (the wandb package and its WANDB_* variables)."""

    kind: Literal["wandb"]
    """`none`, `tensorboard`, `wandb` or `jsonl`: where the per-step metrics go besides Prometheus."""

    run_name: str = ""
    """Name of the run (TRL's `run_name`); "" = wandb's own default."""


class JsonlSettings(_LogFiles):
    """`<dir>/steps.jsonl`, one JSON line per step: what the loop demo reads into report.json."""

    kind: Literal["jsonl"]
    """`none`, `tensorboard`, `wandb` or `jsonl`: where the per-step metrics go besides Prometheus."""


ExperimentLogSettings = Annotated[
    Annotated[NoLogSettings, Tag("none")] | Annotated[TensorBoardSettings, Tag("tensorboard")]
    | Annotated[WandbSettings, Tag("wandb")] | Annotated[JsonlSettings, Tag("jsonl")],
    kind_discriminator("none"),
]


class LoraFinetune(Group):
    """LoRA adapters through peft: small uploads, cheap hot swap."""

    kind: Literal["lora"] = "lora"
    """`lora` or `full`: what the optimizer updates."""

    rank: int = Field(default=16, ge=1)
    """LoRA rank r (peft's `r`)."""

    alpha: int = 32
    """LoRA scaling alpha (peft's `lora_alpha`); the update is scaled by alpha / rank."""

    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA input (peft's `lora_dropout`)."""

    targets: str = "all-linear"
    """peft target_modules ("all-linear", or a comma-separated list of module names)."""


class FullFinetune(Group):
    """Every weight is trained (each version uploads the whole model)."""

    kind: Literal["full"]
    """`lora` or `full`: what the optimizer updates."""


FinetuneSettings = Annotated[
    Annotated[LoraFinetune, Tag("lora")] | Annotated[FullFinetune, Tag("full")], kind_discriminator("lora")]


class TrainerSettings(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_TRAINER_")

    moved_settings: ClassVar[dict[str, str]] = {
        "report_to": "experiment_log.kind", "logging_dir": "experiment_log.dir", "run_name": "experiment_log.run_name",
        "finetune": "finetune.kind", "lora_r": "finetune.rank", "lora_alpha": "finetune.alpha",
        "lora_dropout": "finetune.dropout", "lora_targets": "finetune.targets"}

    common: CommonSettings = Field(default_factory=CommonSettings)

    # --- identity and inputs -----------------------------------------------------------------------
    tenant: str = "default"
    """The one tenant whose data this trainer run trains, into that tenant's versions only. Records of
    other tenants are skipped and counted (`apprentice_trainer_skipped_total{reason="other_tenant"}`)."""

    group_id: str = ""
    """Kafka consumer group, used for lag monitoring only (the offsets that matter live in the
    checkpoint). "" = `apprentice-trainer-<tenant>`. Prefixed with APPRENTICE_TOPIC_PREFIX."""

    weights_endpoint: str = "127.0.0.1:50052"
    """Where `Weights.Upload` is served (docs/architecture.md §2)."""

    metrics_port: int = 9104
    """Prometheus endpoint; 0 disables it."""

    experiment_log: ExperimentLogSettings = Field(default_factory=NoLogSettings)
    """Experiment log of the per-step metrics, as TRL's `report_to`: `kind` = none, tensorboard, wandb or
    jsonl. Prometheus gets the steps either way."""

    state_dir: Path | None = None
    """Checkpoints and trainer state; None = `<APPRENTICE_HOME>/trainer/<tenant>`."""

    rl_enabled: bool = True
    """Train GRPO-family updates on graded traffic."""

    distill_enabled: bool = True
    """Run OEL consolidation rounds when approved knowledge exists for the tenant."""

    max_staleness: int = 4
    """Drop rollouts produced more than this many trainer versions ago: truncated IS corrects small
    policy gaps, not large ones (docs/architecture.md §7)."""

    group_wait_s: float = 120.0
    """How long an incomplete exploration group waits for its siblings before its usable members are
    trained anyway (a sibling may be quarantined or never graded)."""

    # --- RL objective -------------------------------------------------------------------------------
    algorithm: Algorithm = "grpo"
    """grpo (DeepSeekMath), dr_grpo (Liu et al. 2025: no std, constant normaliser), dapo (Yu et al.
    2025: clip-higher, dynamic sampling, token-level loss, overlong shaping), gspo (Zheng et al. 2025:
    sequence-level ratio)."""

    clip_eps_low: float | None = None
    """Lower clip ε. None = 0.2 (PPO/GRPO/DAPO) or 3e-4 (GSPO, whose ratios are per-sequence means)."""

    clip_eps_high: float | None = None
    """Upper clip ε. None = 0.28 for DAPO (clip-higher, as DAPO recommends), 4e-4 for GSPO, else = low."""

    scale_rewards: bool | None = None
    """Divide group advantages by the group's std. None = on for grpo/dapo/gspo, off for dr_grpo
    (Dr. GRPO shows the std term biases towards too-easy/too-hard prompts)."""

    max_completion_length: int = 256
    """Dr. GRPO's constant normaliser, and DAPO's overlong L_max when a rollout does not say its own
    `max_new_tokens`."""

    overlong_buffer: float | None = None
    """DAPO soft overlong punishment: buffer L_cache as a fraction of each rollout's L_max (its
    `max_new_tokens`). None = 0.2 for dapo (DAPO used 4096 of 20480), 0 (off) otherwise."""

    drop_equal_groups: bool | None = None
    """Dynamic sampling: drop groups whose rewards are all equal (zero advantage, wasted compute).
    None = on for dapo, off otherwise (their advantage is 0 either way)."""

    kl_beta: float = 0.0
    """Weight of the KL to the reference (the base model). 0 = no reference pass (as DAPO and
    Dr. GRPO recommend)."""

    kl_mode: KLMode = "k3_loss"
    """k3_loss: β·k3 per token in the loss (DeepSeekMath); k1_reward: r − β·Σ_t log(π_old/π_ref)
    folded into the reward before advantages (the PPO-RLHF form)."""

    is_cap: float = 2.0
    """Truncated importance sampling cap C in w_t = min(π_old/π_rollout, C) (docs/architecture.md §7)."""

    baseline_decay: float = 0.95
    """EMA decay of the per-task running baseline for single-sample traffic (history weight ≤ 20)."""

    # --- OEL consolidation ---------------------------------------------------------------------------
    distill_method: DistillMethod = "rkl_topk"
    """rkl_topk: the OEL objective (student samples, top-k reverse KL to the teacher with knowledge).
    gkd: a fraction `gkd_lambda` of sequences sampled from the teacher, forward KL on those.
    sft_filtered: teacher samples that pass the filter become supervised targets (docs/oel-probe.md: the
    strongest lever for a weak model).
    sft_items: drills per approved item: its questions, the deployment prompts that retrieve it and the
    model's paraphrases of them, answered by the teacher with the item in context, kept when they hold the
    item's answer terms, plus a replay share of general prompts (services/trainer/drill.py,
    docs/consolidation.md)."""

    distill_paraphrases: int = Field(default=3, ge=0, le=8)
    """sft_items: paraphrases the round-start model writes of each question of an item (0: none)."""

    distill_replay_share: float = Field(default=0.25, ge=0.0, lt=1.0)
    """sft_items: share of each batch that replays general prompts with the round-start model's own answers."""

    distill_exclude_questions: Path | None = None
    """sft_items: a file of questions never to train on, one per line (the gate's held-out questions:
    `apprentice demo` writes its task's), even when a paraphrase or a user's question matches one of them
    (compared on lower-cased words)."""

    distill_topk: int = 256
    """k of the top-k reverse KL (the OEL paper's value)."""

    gkd_lambda: float = 0.5
    """GKD mixture: share of sequences sampled from the teacher."""

    retrieval: Literal["serving", "all", "tfidf"] = "serving"
    """Teacher context: what a serving pod would put in that prompt's context (`serving`: the same
    retriever, threshold and margin as inference, so the teacher is the policy users were served), the whole
    knowledge base (`all`), or the `retrieval_items` most similar by TF-IDF (`tfidf`). docs/oel-probe.md
    measured 11/20 with the relevant item alone, 6/20 with two distractors, 6/20 with all ten."""

    retrieval_items: int = 3
    """At most this many items in the teacher's context (serving and tfidf retrieval)."""

    knowledge_snapshots: int = 3
    """Recent snapshots kept per knowledge key; one is sampled per example (the OEL recipe)."""

    prompt_pool: int = 256
    """Recent deployment prompts kept for consolidation."""

    distill_batch: int = 8
    """Prompts per consolidation step."""

    distill_steps: int = 4
    """Optimizer steps per consolidation round."""

    distill_max_new_tokens: int = 48
    """Length of student/teacher samples."""

    distill_temperature: float = 1.0
    """Sampling temperature of student (and teacher) samples; 1 = on-policy for the T=1 objective."""

    sft_min_mean_logprob: float = -1.5
    """sft_filtered without an external grader: keep teacher samples whose mean token log-prob is at
    least this (the teacher was confident)."""

    sft_max_repetition: float = Field(default=0.1, ge=0.0, le=1.0)
    """sft_filtered: drop teacher samples whose share of repeated token 3-grams exceeds this (a sample that
    loops on the fact passes an answer check; imitating it teaches the loop, which the eval gate's
    repetition check then refuses). The same measure as the gate's (shared/decoding/repetition.py)."""

    sft_finished_only: bool = True
    """sft_filtered: keep only teacher samples that ended with the end-of-turn token. A sample cut at
    `distill_max_new_tokens` has none, and a student trained on it learns not to stop (measured: the demo's
    round-2 candidate, trained on cut samples too, repeated itself in 15% of its greedy 3-grams, and the
    gate refused it)."""

    sft_verifier: str = ""
    """sft_filtered: a verifier `package.module:function` called as `fn(messages, text, **params) -> bool | None` on
    each teacher sample (messages = the deployment prompt, without knowledge); only samples it passes
    become targets (None = cannot judge = rejected). The same kind of programmatic check the grader's
    `verifier` graders run. Empty: the confidence filter above."""

    sft_verifier_params: dict[str, str] = Field(default_factory=dict)
    """Keyword arguments for the verifier (JSON in the environment), e.g. {"task": "path/to/task.yaml"}."""

    teacher_samples: int = Field(default=1, ge=1, le=16)
    """sft_filtered: samples drawn from the teacher per prompt; with a verifier, more samples find a
    passing answer for more prompts (distinct passing samples all become targets)."""

    # --- optimisation --------------------------------------------------------------------------------
    finetune: FinetuneSettings = Field(default_factory=LoraFinetune)
    """What training updates: `kind` = lora (adapters through peft, the default: small uploads, cheap hot
    swap, with their rank, alpha, dropout and target modules) or full (every weight)."""

    lr: float = 5e-5
    """AdamW learning rate. OEL used 1e-6–5e-6 for full fine-tuning; LoRA needs ~10× more."""

    warmup_steps: int = Field(default=0, ge=0)
    """Linear learning-rate warm-up over the trainer's first optimizer steps (its lifetime count, kept in
    checkpoints): step t runs at lr · min(1, (t + 1) / warmup_steps); 0 = none. Adam's first steps move
    every trained weight by the full rate at once (services/trainer/schedule.py)."""

    weight_decay: float = 0.0
    """AdamW weight decay."""

    grad_clip: float = 1.0
    """Max global grad norm (OEL, GRPO defaults)."""

    batch_size: int = 16
    """Rollouts per optimizer step."""

    micro_batch_size: int = 4
    """Rollouts per forward/backward; gradients accumulate over batch_size / micro_batch_size."""

    ppo_epochs: int = 1
    """Optimizer passes over one batch. 1 = π_old equals π_θ at the only step (no extra forward);
    >1 recomputes π_old once before the first pass."""

    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    """auto = bf16 autocast where the device supports it (CUDA with bf16), fp32 otherwise."""

    device: str = "auto"
    """auto = cuda if available else cpu."""

    seed: int = 0
    """Seeds torch/python RNGs for reproducible rounds."""

    head_chunk: int = 0
    """Rows per chunk of the fused LM head; 0 = by device (CPU 64: cache-sized; CUDA 4096)."""

    max_steps: int = 0
    """Step budget: total optimizer steps this trainer may take over its lifetime (persisted); 0 = none."""

    # --- schedule ------------------------------------------------------------------------------------
    trigger_samples: int = 32
    """Start an RL round once this many usable rollouts are buffered."""

    trigger_seconds: float = 600.0
    """... or once this long passed since the last round and at least `min_samples` are buffered."""

    min_samples: int = 2
    """Fewest usable rollouts a time-triggered round trains on."""

    trigger_on_knowledge: bool = True
    """Run a consolidation round when a new knowledge version with trainable items arrives."""

    trigger_knowledge_quiet_s: float = 0.0
    """... but only once the knowledge has not changed for this long. The extractor publishes a version
    per change, so a burst of extraction would otherwise start one round (and one candidate version) per
    item; a few seconds of quiet turn the burst into one round on the complete knowledge."""

    poll_max_records: int = 500
    """Records one poll of the graded topic returns at most."""

    poll_timeout_s: float = 0.5
    """How long one poll waits for records."""

    # --- checkpoints ---------------------------------------------------------------------------------
    checkpoint_keep: int = 2
    """Checkpoints kept on disk (the newest is the resume point)."""

    publish: bool = True
    """Upload each new version to the Weights service and announce it on the checkpoints topic."""

    publish_retry_s: float = 5.0
    """First wait before publishing again after a failed publish; later waits grow to twice it (shared/retry.py)."""

    @model_validator(mode="after")
    def _check(self) -> TrainerSettings:
        if not self.tenant.strip():
            raise ValueError("APPRENTICE_TRAINER_TENANT must name the tenant whose data is trained")
        if self.batch_size % self.micro_batch_size:
            raise ValueError("APPRENTICE_TRAINER_BATCH_SIZE must be a multiple of MICRO_BATCH_SIZE")
        if not 0 <= self.gkd_lambda <= 1:
            raise ValueError("APPRENTICE_TRAINER_GKD_LAMBDA is a fraction in [0, 1]")
        if self.is_cap < 1:
            raise ValueError("APPRENTICE_TRAINER_IS_CAP must be >= 1 (C≈2 is usual)")
        if self.distill_topk < 1:
            raise ValueError("APPRENTICE_TRAINER_DISTILL_TOPK must be >= 1")
        return self

    # --- resolved algorithm defaults ---------------------------------------------------------------
    @property
    def resolved_group_id(self) -> str:
        """The consumer group in this stack's namespace (APPRENTICE_TOPIC_PREFIX)."""
        return self.common.topics.group_id(self.group_id or f"apprentice-trainer-{self.tenant}")

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir or (self.common.home / "trainer" / self.tenant)

    @property
    def resolved_logging_dir(self) -> Path:
        log = self.experiment_log
        return (None if isinstance(log, NoLogSettings) else log.dir) or (self.resolved_state_dir / "runs")

    @property
    def resolved_run_name(self) -> str:
        return self.experiment_log.run_name if isinstance(self.experiment_log, WandbSettings) else ""

    @property
    def resolved_eps(self) -> tuple[float, float]:
        low = self.clip_eps_low if self.clip_eps_low is not None else (3e-4 if self.algorithm == "gspo" else 0.2)
        if self.clip_eps_high is not None:
            high = self.clip_eps_high
        else:
            high = {"dapo": 0.28, "gspo": 4e-4}.get(self.algorithm, low)
        return low, high

    @property
    def resolved_scale_rewards(self) -> bool:
        return self.scale_rewards if self.scale_rewards is not None else self.algorithm != "dr_grpo"

    @property
    def resolved_overlong_buffer(self) -> float:
        if self.overlong_buffer is not None:
            return self.overlong_buffer
        return 0.2 if self.algorithm == "dapo" else 0.0

    @property
    def resolved_drop_equal_groups(self) -> bool:
        return self.drop_equal_groups if self.drop_equal_groups is not None else self.algorithm == "dapo"
