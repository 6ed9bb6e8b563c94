"""What the grader is waiting for: the interactions whose feedback window is open, per tenant and task.

The faust runtime keeps a `WaitingIndex` beside its due-time index (stream/app.py's `due`) and exports its
summary at every tick as Prometheus gauges (metrics.py `export_waiting`, names in
shared/contracts/metric_names.py); `apprentice status` and the dashboard read them back through
shared/contracts/grader_waiting.py, never through this module.
"""

from __future__ import annotations

import math

from services.grader.core.state import PendingState


class WaitingIndex:
    """key -> (tenant, task, deadline) of every state whose feedback window is open."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[str, str, float]] = {}

    def update(self, key: str, state: PendingState | None, open_: bool) -> None:
        if state is not None and open_ and state.interaction is not None:
            self._by_key[key] = (state.tenant, state.task, state.deadline)
        else:
            self._by_key.pop(key, None)

    def discard(self, key: str) -> None:
        self._by_key.pop(key, None)

    def __len__(self) -> int:
        return len(self._by_key)

    def summary(self) -> dict[tuple[str, str], tuple[int, float, float]]:
        """(tenant, task) -> (how many, earliest deadline, latest deadline)."""
        out: dict[tuple[str, str], tuple[int, float, float]] = {}
        for tenant, task, deadline in self._by_key.values():
            n, lo, hi = out.get((tenant, task), (0, math.inf, -math.inf))
            out[(tenant, task)] = (n + 1, min(lo, deadline), max(hi, deadline))
        return out
