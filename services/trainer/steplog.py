"""Per-step training metrics --> an experiment log: TensorBoard or Weights & Biases, chosen like TRL's
`report_to` (`none`, `tensorboard`, `wandb`, or `jsonl`: one JSON line per step, which the loop demo
reads into its report), so a run of the trainer service can be read with the same
tools as a TRL run. Prometheus (metrics.py) gets the same steps regardless; an experiment log adds the
full per-step history in a file or a W&B project without a Prometheus server.

Scalars are written as `<algorithm>/<name>`, with TRL's names where TRL has the quantity (`loss`, `kl`,
`clip_ratio`, `reward`, `reward_std`, `completions/mean_length`, `grad_norm`), at the policy's lifetime
step, so that RL and OEL rounds of one trainer share one x axis without mixing their curves.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

StepHook = Callable[[dict[str, float]], None]
"""Receives one optimizer step's metrics (rl.py, distill.py)."""

ReportTo = Literal["none", "tensorboard", "wandb", "jsonl"]

TRL_NAMES = {"loss": "loss", "kl": "kl", "clip_fraction": "clip_ratio", "reward_mean": "reward",
             "reward_std": "reward_std", "response_length": "completions/mean_length", "grad_norm": "grad_norm"}


class ReportingUnavailable(RuntimeError):
    """The chosen experiment log cannot be opened here (its package is not installed): a startup error."""


class ExperimentLog(Protocol):
    def log_step(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_round(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def tag(algorithm: str, key: str) -> str:
    return f"{algorithm}/{TRL_NAMES.get(key, key)}"


class NoLog:
    """report_to=none."""

    def log_step(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_round(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


MISSING = {
    "tensorboard": "APPRENTICE_TRAINER_EXPERIMENT_LOG__KIND=tensorboard needs the tensorboard package, which is not "
                   "installed: pip install 'apprentice[tensorboard]' (or set EXPERIMENT_LOG__KIND=none)",
    "wandb": "APPRENTICE_TRAINER_EXPERIMENT_LOG__KIND=wandb needs the wandb package, which is not installed: "
             "pip install wandb (or set EXPERIMENT_LOG__KIND=none or tensorboard)",
}


def require_available(report_to: str) -> None:
    """ReportingUnavailable when `report_to`'s package is missing: checked before torch and the model are
    loaded, so a wrong setting costs a second, not minutes."""
    if report_to in MISSING and importlib.util.find_spec(report_to) is None:
        raise ReportingUnavailable(MISSING[report_to])


class TensorBoardLog:
    """Event files under `log_dir` (`tensorboard --logdir <log_dir>`)."""

    def __init__(self, log_dir: Path) -> None:
        require_available("tensorboard")
        # optional: tensorboard (the tensorboard extra), only with that experiment log
        from torch.utils.tensorboard import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log_step(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(tag(algorithm, key), value, step)
        self.writer.flush()   # a step is seconds or more: readers see each one as it happens

    def log_round(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(f"{algorithm}/round/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class JsonlLog:
    """`<log_dir>/steps.jsonl`: one line per optimizer step or round, `{"kind": "step"|"round",
    "algorithm", "step", "time", "metrics"}`, appended and flushed as it happens. No extra package, and
    a reader on the same machine (the loop demo's report) follows it by offset."""

    FILE = "steps.jsonl"

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / self.FILE
        self.f = self.path.open("a", encoding="utf-8")

    def _write(self, kind: str, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        row = {"kind": kind, "algorithm": algorithm, "step": step, "time": time.time(),
               # a non-finite value (a diverged loss) is null: NaN is not JSON, and readers must parse every line
               "metrics": {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}}
        self.f.write(json.dumps(row, allow_nan=False) + "\n")
        self.f.flush()

    def log_step(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        self._write("step", algorithm, step, metrics)

    def log_round(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        self._write("round", algorithm, step, metrics)

    def close(self) -> None:
        self.f.close()


class WandbLog:
    """A W&B run (project, entity, API key and mode from wandb's own WANDB_* environment variables)."""

    def __init__(self, log_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        require_available("wandb")
        # optional: wandb is not a dependency; only with that experiment log
        import wandb

        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(name=run_name or None, dir=str(log_dir), config=dict(config))

    def log_step(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({tag(algorithm, k): v for k, v in metrics.items()}, step=step)

    def log_round(self, algorithm: str, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({f"{algorithm}/round/{k}": v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def open_log(report_to: str, log_dir: Path, *, run_name: str = "",
             config: Mapping[str, Any] | None = None) -> ExperimentLog:
    """The experiment log `report_to` names; ReportingUnavailable when its package is missing."""
    if report_to == "none":
        return NoLog()
    if report_to == "tensorboard":
        out: ExperimentLog = TensorBoardLog(log_dir)
    elif report_to == "wandb":
        out = WandbLog(log_dir, run_name, config or {})
    elif report_to == "jsonl":
        out = JsonlLog(log_dir)
    else:
        raise ValueError(f"unknown report_to {report_to!r}; use none, tensorboard, wandb or jsonl")
    log.info("experiment log open", extra={"report_to": report_to, "log_dir": str(log_dir)})
    return out
