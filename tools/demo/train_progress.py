"""The trainer's progress as the demo sees it from outside: optimizer steps (each one the teacher sampling
of its batch, then the update) read from the trainer's `/metrics`, with rate and ETA toward the round's
planned steps. The trainer runs as its own process with its log in a file, so its own progress bar never
reaches the person watching the demo; this is the one they see.
"""

from __future__ import annotations

import time

from tqdm import tqdm

from shared.contracts.metric_names import TRAINER_OPTIMIZER_STEPS
from shared.metrics import metric_sum, scrape


def _read(port: int) -> str | None:
    return scrape(f"127.0.0.1:{port}")


class TrainingProgress:
    """Steps of the current round: `start()` when the round starts, then `describe()` on every poll."""

    def __init__(self, metrics_port: int, planned_steps: int | None, *, meter: bool) -> None:
        """`meter`: a tqdm meter with rate and ETA (a terminal); else a plain count (a log).
        `planned_steps` None: the round's step count is not known in advance (GRPO steps follow the
        graded samples), so no total and no ETA are shown."""
        self.port, self.meter = metrics_port, meter
        self.planned = None if planned_steps is None else max(planned_steps, 1)
        self.name = TRAINER_OPTIMIZER_STEPS
        self.base: float | None = None
        self.t0 = time.monotonic()

    def start(self) -> None:
        self.base = metric_sum(_read(self.port), self.name)
        self.t0 = time.monotonic()

    def describe(self, text: str | None = None) -> str:
        """`training 3/8 [02:00<03:20, 40.00s/step]`, or "" before the trainer has said anything."""
        total = metric_sum(text if text is not None else _read(self.port), self.name)
        if total is None:
            return ""
        if self.base is None:
            self.base = total
        done = int(total - self.base)
        if not self.meter:
            return f"training step {done}" + (f"/{self.planned}" if self.planned is not None else "")
        shown = done if self.planned is None else min(done, self.planned)
        return str(tqdm.format_meter(shown, self.planned, time.monotonic() - self.t0,
                                     prefix="training", unit="step", ncols=60))
