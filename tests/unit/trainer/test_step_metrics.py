"""Per-step training metrics on the real tiny model: what rl_round and consolidation_round report per
optimizer step, the Prometheus gauges/counters they set, and the TensorBoard log read back from disk."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.trainer import metrics as M
from services.trainer.distill import DistillExample
from services.trainer.rollouts import Rollout
from services.trainer.rounds import Trainer
from services.trainer.settings import JsonlSettings, TensorBoardSettings, TrainerSettings
from services.trainer.steplog import NoLog, ReportingUnavailable, TensorBoardLog, open_log
from shared.settings import CommonSettings


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str):  # noqa: ANN201
    from shared.models import load_model

    return load_model(tiny_model_name)


def make_trainer(tiny, **kw) -> Trainer:  # noqa: ANN001
    model, tok = tiny
    s = TrainerSettings(common=CommonSettings(model="tiny-random"), tenant="acme", lr=1e-3, batch_size=4, micro_batch_size=2,
                        distill_batch=2, distill_steps=1, distill_max_new_tokens=4, **kw)
    return Trainer(s, model=copy.deepcopy(model), tokenizer=tok)


def rollouts(n_groups: int = 3, size: int = 4) -> list[Rollout]:
    rng = random.Random(1)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(100, 5000) for _ in range(4)]
        for k in range(size):
            comp = [rng.randrange(100, 5000) for _ in range(2 + k)]
            out.append(Rollout(f"{g}-{k}", prompt, comp, reward=float(k % 2), tenant="acme", group_id=f"g{g}",
                               group_size=size, policy_version="v1" if g else "base"))
    return out


def test_rl_round_reports_every_step_to_a_tensorboard_log_read_back(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = make_trainer(tiny, experiment_log=TensorBoardSettings(kind="tensorboard", dir=tmp_path / "runs"))
    log = open_log(t.settings.experiment_log.kind, t.settings.resolved_logging_dir)
    assert isinstance(log, TensorBoardLog)
    seen: list[tuple[str, int, dict[str, float]]] = []

    def on_step(algorithm: str, m: dict[str, float]) -> None:
        seen.append((algorithm, t.policy.steps, m))
        log.log_step(algorithm, t.policy.steps, m)

    t.on_step = on_step
    t.staleness_of = lambda r: 2.0 if r.policy_version == "base" else 0.0
    r = t.rl_round(rollouts())
    log.log_round(r.algorithm, t.policy.steps, r.metrics)
    log.close()

    assert r.steps == 3 and [s for _, s, _ in seen] == [1, 2, 3]      # 12 rollouts, batches of 4
    assert {a for a, _, _ in seen} == {"grpo"}
    steps = [m for _, _, m in seen]
    for m in steps:
        for key in ("loss", "kl", "clip_fraction", "reward_mean", "reward_std", "tokens_per_s", "response_length",
                    "grad_norm", "staleness", "seconds"):
            assert math.isfinite(m[key]), key
        assert m["reward_mean"] == pytest.approx(0.5) and m["reward_std"] == pytest.approx(0.5)
        assert m["response_length"] == pytest.approx(3.5)                 # completions of 2..5 tokens per group
        assert m["tokens_per_s"] > 0 and m["grad_norm"] > 0
    assert steps[0]["staleness"] == 2.0 and steps[1]["staleness"] == 0.0  # batches follow the groups
    assert steps[0]["stale_fraction"] == 1.0 and steps[1]["stale_fraction"] == 0.0
    for m in steps:   # no behaviour log-probs recorded: w = 1 everywhere, nothing truncated
        assert m["is_weight_mean"] == pytest.approx(1.0) and m["is_weight_max"] == pytest.approx(1.0)
        assert m["is_capped_fraction"] == 0.0
    assert sum(m["tokens"] for m in steps) == r.metrics["tokens"]
    assert sum(m["loss"] for m in steps) / 3 == pytest.approx(r.metrics["loss"], rel=1e-5)

    # the event file, read back as TensorBoard reads it: TRL's names, one point per step
    acc = EventAccumulator(str(tmp_path / "runs")).Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"grpo/loss", "grpo/kl", "grpo/clip_ratio", "grpo/reward", "grpo/reward_std",
            "grpo/completions/mean_length", "grpo/grad_norm", "grpo/tokens_per_s"} <= tags
    loss = acc.Scalars("grpo/loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([m["loss"] for m in steps], rel=1e-6)
    assert [e.value for e in acc.Scalars("grpo/reward")] == pytest.approx([0.5, 0.5, 0.5])
    assert [e.step for e in acc.Scalars("grpo/round/loss")] == [3]
    assert acc.Scalars("grpo/round/loss")[0].value == pytest.approx(r.metrics["loss"], rel=1e-5)


def test_consolidation_round_reports_every_step(tiny) -> None:  # noqa: ANN001
    t = make_trainer(tiny)
    seen: list[tuple[str, dict[str, float]]] = []
    t.on_step = lambda algorithm, m: seen.append((algorithm, m))
    ex = [DistillExample([{"role": "user", "content": q}], task="support") for q in ("warranty?", "returns?")]
    r = t.consolidation_round(ex, ["The warranty lasts 14 months."])
    assert len(seen) == r.steps == 1 and {a for a, _ in seen} == {"oel"}
    for _, m in seen:
        assert math.isfinite(m["loss"]) and math.isfinite(m["kl"]) and m["tokens"] > 0
        assert 0 < m["response_length"] <= 4 and m["tokens_per_s"] > 0
    assert sum(m["tokens"] for _, m in seen) == r.metrics["tokens"]


def test_record_step_sets_one_metric_per_quantity() -> None:
    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    steps_before = value("apprentice_trainer_optimizer_steps_total", algorithm="dapo") or 0.0
    tokens_before = value("apprentice_trainer_trained_tokens_total", algorithm="dapo") or 0.0
    M.record_step("dapo", 41, {"loss": 0.25, "kl": 0.01, "clip_fraction": 0.125, "reward_mean": 0.5,
                               "reward_std": 0.2, "tokens_per_s": 900.0, "response_length": 31.0, "staleness": 1.5,
                               "grad_norm": 2.0, "tokens": 120.0, "seconds": 0.4})
    assert value("apprentice_trainer_loss", algorithm="dapo") == 0.25
    assert value("apprentice_trainer_kl", algorithm="dapo") == 0.01
    assert value("apprentice_trainer_clip_fraction", algorithm="dapo") == 0.125
    assert value("apprentice_trainer_reward_mean", algorithm="dapo") == 0.5
    assert value("apprentice_trainer_reward_std", algorithm="dapo") == 0.2
    assert value("apprentice_trainer_tokens_per_second", algorithm="dapo") == 900.0
    assert value("apprentice_trainer_response_length_tokens", algorithm="dapo") == 31.0
    assert value("apprentice_trainer_mean_staleness_versions", algorithm="dapo") == 1.5
    assert value("apprentice_trainer_lifetime_steps") == 41
    assert value("apprentice_trainer_optimizer_steps_total", algorithm="dapo") == steps_before + 1
    assert value("apprentice_trainer_trained_tokens_total", algorithm="dapo") == tokens_before + 120
    assert (value("apprentice_trainer_step_seconds_count", algorithm="dapo") or 0) >= 1


def test_report_to_none_and_a_missing_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_log("none", tmp_path), NoLog)
    assert not (tmp_path / "x").exists()
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ReportingUnavailable, match="pip install wandb"):
        open_log("wandb", tmp_path)
    with pytest.raises(ValueError, match="none, tensorboard, wandb or jsonl"):
        open_log("mlflow", tmp_path)
    unsupported: Any = {"kind": "mlflow"}       # not one of the union's kinds: refused at run time
    with pytest.raises(ValueError):
        TrainerSettings(experiment_log=unsupported)


def test_rl_steps_in_a_jsonl_log_read_back_by_the_demo_report(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    """The demo's path: the trainer writes steps.jsonl (report_to=jsonl), the report takes up each round's
    new steps, with the off-policy view of every step: old-version samples and the IS weights that
    corrected the recorded behaviour log-probs."""
    from tools.demo.report import StepsLog

    t = make_trainer(tiny, experiment_log=JsonlSettings(kind="jsonl", dir=tmp_path / "runs"), is_cap=1.5)
    log = open_log(t.settings.experiment_log.kind, t.settings.resolved_logging_dir)
    t.on_step = lambda algorithm, m: log.log_step(algorithm, t.policy.steps, m)
    t.staleness_of = lambda r: 1.0 if r.policy_version == "base" else 0.0
    rs = rollouts()
    for ro in rs:   # behaviour log-probs well below the trainer's: ratios π_old/π_rollout far above the cap
        ro.behaviour_logprobs = [-30.0] * len(ro.completion_ids)
    reader = StepsLog(tmp_path / "runs" / "steps.jsonl")
    assert reader.new_steps() == []                       # nothing written yet
    r = t.rl_round(rs)
    log.log_round(r.algorithm, t.policy.steps, r.metrics)
    steps = reader.new_steps()
    assert [s["step"] for s in steps] == [1, 2, 3] and {s["algorithm"] for s in steps} == {"grpo"}
    assert [s["stale_fraction"] for s in steps] == [1.0, 0.0, 0.0]
    for s in steps:
        assert s["is_capped_fraction"] == pytest.approx(1.0)   # every real token truncated
        assert s["is_weight_mean"] == pytest.approx(1.5)       # ... to the cap
        assert s["is_weight_max"] > 1e6                        # the untruncated ratio
    assert reader.new_steps() == []                       # each step is reported once
    [summary] = reader.take_rounds()                      # the round's summary, once, apart from its steps
    assert summary["algorithm"] == "grpo" and summary["step"] == 3 and summary["steps"] == 3
    assert reader.take_rounds() == []
    log.close()
