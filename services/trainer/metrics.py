"""Prometheus metrics of the trainer (served on :9104/metrics). Defined once per process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECORDS = Counter("trainer_records_total", "Records read, by topic and outcome", ["topic", "outcome"])
SKIPPED = Counter("trainer_skipped_total", "Graded records not trained, by reason", ["reason"])
ROUNDS = Counter("trainer_rounds_total", "Training rounds, by algorithm", ["algorithm"])
ROUND_METRIC = Gauge("trainer_round_metric", "Metrics of the last round (loss, kl, reward_mean, reward_std, "
                     "adv_*, clip_fraction, is_capped_fraction, is_max_gap, grad_norm, tokens_per_s, ...)",
                     ["algorithm", "name"])
STALENESS = Histogram("trainer_staleness_versions", "Policy versions between a rollout's producer and the "
                      "trainer, at training time", buckets=(0, 1, 2, 3, 4, 6, 8, 16))
BUFFER = Gauge("trainer_buffer_rollouts", "Usable rollouts waiting in the RL buffer")
PROMPTS = Gauge("trainer_prompt_pool", "Deployment prompts kept for consolidation")
STEPS = Gauge("trainer_optimizer_steps", "Optimizer steps taken over the trainer's lifetime")
PUBLISHED = Counter("trainer_versions_published_total", "Versions uploaded and announced")
PUBLISH_FAILURES = Counter("trainer_publish_failures_total", "Failed upload/announce attempts (retried)")
CHECKPOINT_SECONDS = Histogram("trainer_checkpoint_seconds", "Time to write one checkpoint")


def record_round(algorithm: str, metrics: dict[str, float]) -> None:
    ROUNDS.labels(algorithm).inc()
    for name, value in metrics.items():
        ROUND_METRIC.labels(algorithm, name).set(value)
