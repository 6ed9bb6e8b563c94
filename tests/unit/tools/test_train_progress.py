"""The demo's view of the trainer's progress: optimizer steps since the round started, from the trainer's
real metrics exposition, as a count in logs or a meter with rate and ETA on a terminal."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from shared.contracts.metric_names import TRAINER_OPTIMIZER_STEPS
from shared.metrics import metric_sum
from tools.demo.train_progress import TrainingProgress


def _exposition(steps_by_algo: dict[str, int]) -> str:
    reg = CollectorRegistry()
    c = Counter(TRAINER_OPTIMIZER_STEPS.removesuffix("_total"), "steps", ["algorithm"], registry=reg)
    for algo, n in steps_by_algo.items():
        c.labels(algo).inc(n)
    return generate_latest(reg).decode()


def test_counts_steps_since_the_round_started() -> None:
    assert TRAINER_OPTIMIZER_STEPS.endswith("_total")
    assert metric_sum(_exposition({"oel": 2, "grpo": 3}), TRAINER_OPTIMIZER_STEPS) == 5.0
    assert metric_sum("other_metric 1\n", TRAINER_OPTIMIZER_STEPS) is None and metric_sum(None, "x") is None
    plain = TrainingProgress(1, planned_steps=8, meter=False)
    assert plain.describe(text="") == ""                                  # trainer not answering yet
    assert plain.describe(text=_exposition({"oel": 5})) == "training step 0/8"   # first sight = the baseline
    assert plain.describe(text=_exposition({"oel": 8})) == "training step 3/8"


def test_an_unplanned_round_counts_without_a_total() -> None:
    # GRPO's steps follow the graded samples: "13/8" would be a wrong plan, so no total is shown
    plain = TrainingProgress(1, planned_steps=None, meter=False)
    plain.base = 0.0
    assert plain.describe(text=_exposition({"grpo": 13})) == "training step 13"
    meter = TrainingProgress(1, planned_steps=None, meter=True)
    meter.base = 0.0
    meter.t0 -= 60
    line = meter.describe(text=_exposition({"grpo": 3}))
    assert line.startswith("training") and "3" in line and "/" not in line.split("[")[0] and "<" not in line


def test_meter_has_rate_and_eta() -> None:
    meter = TrainingProgress(1, planned_steps=8, meter=True)
    meter.base = 0.0
    meter.t0 -= 120                                                        # two minutes into the round
    line = meter.describe(text=_exposition({"oel": 3}))
    assert line.startswith("training") and "3/8" in line and "[02:00<03:20, 40.00s/step]" in line


def test_metric_sum_skips_lines_that_do_not_parse_and_non_finite_values() -> None:
    text = ("apprentice_x_total{a=\"1\"} 2\napprentice_x_total{a=\"2\"} NaN\napprentice_x_total{a=\"3\"} +Inf\n"
            "apprentice_x_total\napprentice_x_total{a=\"4\"} twelve\napprentice_x_total{a=\"5\"} 3\n")
    assert metric_sum(text, "apprentice_x_total") == 5.0
    assert metric_sum("apprentice_x_total NaN\n", "apprentice_x_total") is None
