"""Prometheus metrics of the trainer (served on :9104/metrics). Defined once per process.

Per optimizer step the trainer sets one gauge per quantity (the last step's value: a dashboard plots
them as training curves, Prometheus keeps the history) and feeds counters and histograms where a rate
or a distribution is what an operator asks for (steps/s, trained tokens/s, step time). Quantities are
separate metrics, never a `name` label, so that each has its own HELP text and type and PromQL can
combine them. Per-round values the gauges do not carry (advantage statistics, gold NLL, ...) are in
the round's log line and the checkpoint's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

from shared.contracts.metric_names import TRAINER_OPTIMIZER_STEPS, counter_name

# --- intake ----------------------------------------------------------------------------------------
RECORDS = Counter("apprentice_trainer_records_total", "Records read, by topic and outcome", ["topic", "outcome"])
SKIPPED = Counter("apprentice_trainer_skipped_total", "Graded records not trained, by reason", ["reason"])
STALENESS = Histogram("apprentice_trainer_staleness_versions", "Policy versions between a rollout's producer and "
                      "the trainer, at training time", buckets=(0, 1, 2, 3, 4, 6, 8, 16))
BUFFER = Gauge("apprentice_trainer_buffer_rollouts", "Usable rollouts waiting in the RL buffer")
PROMPTS = Gauge("apprentice_trainer_prompt_pool_prompts", "Deployment prompts kept for consolidation")

# --- rounds ----------------------------------------------------------------------------------------
ROUNDS = Counter("apprentice_trainer_rounds_total", "Training rounds, by algorithm", ["algorithm"])
ROUND_SECONDS = Histogram("apprentice_trainer_round_seconds", "Wall time of one training round (sampling "
                          "included)", ["algorithm"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600))

# --- optimizer steps -------------------------------------------------------------------------------
STEPS = Counter(counter_name(TRAINER_OPTIMIZER_STEPS), "Optimizer steps taken by this process",
                ["algorithm"])
LIFETIME_STEP = Gauge("apprentice_trainer_lifetime_steps", "Optimizer steps of the policy over the trainer's "
                      "lifetime (restored from the checkpoint; the x axis of TensorBoard/W&B logs)")
TRAINED_TOKENS = Counter("apprentice_trainer_trained_tokens_total", "Completion tokens in optimizer steps",
                         ["algorithm"])
STEP_SECONDS = Histogram("apprentice_trainer_step_seconds", "Forward, backward and update of one optimizer step "
                         "(sampling excluded)", ["algorithm"],
                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
LOSS = Gauge("apprentice_trainer_loss", "Loss of the last optimizer step", ["algorithm"])
KL = Gauge("apprentice_trainer_kl", "Per-token KL of the last step: to pi_old (RL) or to the teacher (OEL; the "
           "NLL of the targets for oel_sft)", ["algorithm"])
KL_REF = Gauge("apprentice_trainer_kl_ref", "Per-token k3 KL to the reference model of the last RL step "
               "(only when kl_beta > 0)", ["algorithm"])
CLIP_FRACTION = Gauge("apprentice_trainer_clip_fraction", "Share of tokens whose ratio was clipped, last RL step",
                      ["algorithm"])
IS_CAPPED_FRACTION = Gauge("apprentice_trainer_is_capped_fraction", "Share of tokens whose truncated-IS weight hit "
                           "the cap, last RL step", ["algorithm"])
GRAD_NORM = Gauge("apprentice_trainer_grad_norm", "Global gradient norm before clipping, last step", ["algorithm"])
REWARD_MEAN = Gauge("apprentice_trainer_reward_mean", "Mean shaped reward of the last RL step's rollouts",
                    ["algorithm"])
REWARD_STD = Gauge("apprentice_trainer_reward_std", "Std of the shaped reward of the last RL step's rollouts",
                   ["algorithm"])
TOKENS_PER_SECOND = Gauge("apprentice_trainer_tokens_per_second", "Trained completion tokens per second of the "
                          "last step", ["algorithm"])
RESPONSE_LENGTH = Gauge("apprentice_trainer_response_length_tokens", "Mean completion length of the last step",
                        ["algorithm"])
MEAN_STALENESS = Gauge("apprentice_trainer_mean_staleness_versions", "Mean policy-version staleness of the last RL "
                       "step's rollouts", ["algorithm"])

PUBLISHED = Counter("apprentice_trainer_versions_published_total", "Versions uploaded and announced")
PUBLISH_FAILURES = Counter("apprentice_trainer_publish_failures_total", "Failed upload/announce attempts (retried)")
CHECKPOINT_SECONDS = Histogram("apprentice_trainer_checkpoint_seconds", "Time to write one checkpoint")

# step-metric key (rl.py / distill.py) --> the gauge that carries it
STEP_GAUGES: dict[str, Gauge] = {
    "loss": LOSS, "kl": KL, "kl_ref": KL_REF, "clip_fraction": CLIP_FRACTION,
    "is_capped_fraction": IS_CAPPED_FRACTION, "grad_norm": GRAD_NORM, "reward_mean": REWARD_MEAN,
    "reward_std": REWARD_STD, "tokens_per_s": TOKENS_PER_SECOND, "response_length": RESPONSE_LENGTH,
    "staleness": MEAN_STALENESS,
}


def record_step(algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
    """One optimizer step: the last-step gauges it has values for, the step/token counters, step time."""
    for key, gauge in STEP_GAUGES.items():
        if key in metrics:
            gauge.labels(algorithm).set(metrics[key])
    STEPS.labels(algorithm).inc()
    LIFETIME_STEP.set(step)
    TRAINED_TOKENS.labels(algorithm).inc(metrics.get("tokens", 0.0))
    if "seconds" in metrics:
        STEP_SECONDS.labels(algorithm).observe(metrics["seconds"])


def record_round(algorithm: str, metrics: Mapping[str, float]) -> None:
    ROUNDS.labels(algorithm).inc()
    if "seconds" in metrics:
        ROUND_SECONDS.labels(algorithm).observe(metrics["seconds"])
