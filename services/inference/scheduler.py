"""Waiting requests --> rows admitted into the running batch: within a rows x tokens budget, fair across tenants.

The continuous-batching engine calls `admit` at every step boundary; what it returns joins the running
batch at once. Rules, in order:
1. Budget. Every admitted row reserves `row_tokens` (prompt + max new tokens, at most the context window):
   the rows in flight never hold more than `max_rows` rows or `max_tokens` reserved tokens. A request that
   does not fit waits; nothing grows past the cap. A request's n rows may be admitted over several steps.
2. Tenant share. While another tenant has work (rows waiting or in flight, or had within the last
   `borrow_after_s`), one tenant's rows hold at most `tenant_share` of each budget, so another tenant's
   request finds room at the next step and every step stays short. A tenant alone may borrow the whole
   budget; when another tenant arrives, `over_share` says how many rows the borrower gives back, and the
   engine preempts them (services/inference/engines/continuous.py) and `requeue`s them here, first in
   their tenant's queue.
3. Fairness. Tenants take turns, one row each per turn (round-robin over per-tenant FIFO queues; the
   tenant served first goes to the back for the next call); within a tenant, requests are served in
   arrival order.
4. No starvation. A request that does not fit may be overtaken by smaller ones for `max_overtake_s`; once
   it is the oldest waiting request past that age, admission holds everything else until it fits.

Pure bookkeeping: no torch, no threads (the scheduler thread owns it), a clock that tests can replace.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True)
class Budget:
    max_rows: int                   # rows decoded together (all tenants, all versions)
    max_tokens: int                 # sum over rows in flight of their reserved tokens
    tenant_share: float = 1.0       # fraction of each budget one tenant may hold, (0, 1]
    max_overtake_s: float = 5.0     # how long a request that does not fit may be overtaken
    borrow_after_s: float = 2.0     # others idle this long: a lone tenant may exceed its share

    def __post_init__(self) -> None:
        assert self.max_rows >= 1 and self.max_tokens >= 1, "budgets must be >= 1"
        assert 0 < self.tenant_share <= 1, "tenant_share must be within (0, 1]"
        assert self.max_overtake_s >= 0, "max_overtake_s must be >= 0"
        assert self.borrow_after_s >= 0, "borrow_after_s must be >= 0"

    @property
    def tenant_rows(self) -> int:
        return max(1, int(self.max_rows * self.tenant_share))

    @property
    def tenant_tokens(self) -> int:
        return max(1, int(self.max_tokens * self.tenant_share))


@dataclass
class _Waiting(Generic[T]):
    item: T
    tenant: str
    rows: int                       # rows not yet admitted
    row_tokens: int                 # reserved per row (clamped so that one row always fits a tenant's share)
    since: float                    # when it was queued


@dataclass
class _Usage:
    rows: int = 0
    tokens: int = 0


@dataclass
class Admission(Generic[T]):
    """Per-tenant FIFO queues of waiting requests and the budget held by admitted rows."""

    budget: Budget
    clock: Callable[[], float] = time.monotonic
    _queues: dict[str, deque[_Waiting[T]]] = field(default_factory=dict)   # dict order = turn order
    _where: dict[T, _Waiting[T]] = field(default_factory=dict)
    _usage: dict[str, _Usage] = field(default_factory=dict)
    _total: _Usage = field(default_factory=_Usage)
    _idle_since: dict[str, float] = field(default_factory=dict)   # tenants whose work ended recently

    # --- queue --------------------------------------------------------------------------------------
    def push(self, item: T, tenant: str, rows: int, row_tokens: int) -> None:
        """Queue `item`: `rows` rows that each reserve `row_tokens` tokens while in flight."""
        assert item not in self._where, "an item is queued once"
        assert rows >= 1 and row_tokens >= 1, "a request has >= 1 row of >= 1 token"
        w = _Waiting(item, tenant, rows, min(row_tokens, self.budget.tenant_tokens), self.clock())
        self._queues.setdefault(tenant, deque()).append(w)
        self._where[item] = w

    def requeue(self, item: T, tenant: str, rows: int, row_tokens: int) -> None:
        """`rows` admitted rows of `item` were preempted (their reservations already released): they wait
        again, ahead of their tenant's other requests."""
        assert rows >= 1, "requeue at least one row"
        w = self._where.get(item)
        if w is not None:
            w.rows += rows
            return
        w = _Waiting(item, tenant, rows, row_tokens, self.clock())
        self._queues.setdefault(tenant, deque()).appendleft(w)
        self._where[item] = w

    def drop(self, item: T) -> int:
        """Stop waiting for `item` (cancelled, failed); returns how many of its rows were never admitted."""
        w = self._where.pop(item, None)
        if w is None:
            return 0
        q = self._queues[w.tenant]
        q.remove(w)
        if not q:
            self._forget(w.tenant)
        return w.rows

    def waiting(self) -> list[T]:
        """Items with rows not yet admitted, oldest first per tenant."""
        return [w.item for q in self._queues.values() for w in q]

    # --- budget ---------------------------------------------------------------------------------------
    @property
    def rows_in_flight(self) -> int:
        return self._total.rows

    @property
    def tokens_in_flight(self) -> int:
        return self._total.tokens

    def usage(self, tenant: str) -> tuple[int, int]:
        """(rows, reserved tokens) the tenant's admitted rows hold."""
        u = self._usage.get(tenant)
        return (0, 0) if u is None else (u.rows, u.tokens)

    def release(self, tenant: str, row_tokens: int) -> None:
        """One admitted row finished: its reservation returns to the budget."""
        u = self._usage.get(tenant)
        assert u is not None and u.rows >= 1, "released more than admitted"
        u.rows -= 1
        u.tokens -= row_tokens
        self._total.rows -= 1
        self._total.tokens -= row_tokens
        assert u.rows >= 0 and u.tokens >= 0 and self._total.rows >= 0, "released more than admitted"
        if u.rows == 0 and tenant not in self._queues:
            del self._usage[tenant]
            self._idle_since[tenant] = self.clock()

    def over_share(self) -> dict[str, tuple[int, int]]:
        """Tenants holding more than their share while another tenant waits: (rows, tokens) each must
        give back. Empty when no one is waiting for room beside a borrower."""
        b = self.budget
        waiting = {t for t, q in self._queues.items() if q}
        out: dict[str, tuple[int, int]] = {}
        for tenant, u in self._usage.items():
            if not waiting - {tenant}:
                continue
            rows, tokens = u.rows - b.tenant_rows, u.tokens - b.tenant_tokens
            if rows > 0 or tokens > 0:
                out[tenant] = (max(0, rows), max(0, tokens))
        return out

    # --- admission ------------------------------------------------------------------------------------
    def admit(self, eligible: Callable[[T], bool] | None = None) -> list[tuple[T, int, int]]:
        """Rows to admit now, as (item, rows, tokens reserved per row); the budget is charged at once.

        `eligible(item)` False leaves an item waiting this time (e.g. its version's batch cannot take rows
        now); it neither blocks its tenant's later requests from others' turns nor triggers a hold."""
        granted: dict[T, list[int]] = {}
        now = self.clock()
        self._idle_since = {t: at for t, at in self._idle_since.items()
                            if now - at < self.budget.borrow_after_s and t not in self._queues and t not in self._usage}
        hold = self._starving(now, eligible)
        first_served: str | None = None
        progress = True
        while progress:
            progress = False
            for tenant, q in list(self._queues.items()):
                w = next((w for w in q if eligible is None or eligible(w.item)), None)
                if w is None or (hold is not None and w is not hold) or not self._fits(w):
                    continue
                self._charge(w)
                granted.setdefault(w.item, [0, w.row_tokens])[0] += 1
                first_served = first_served or tenant
                w.rows -= 1
                if w.rows == 0:
                    q.remove(w)
                    del self._where[w.item]
                    if hold is w:
                        hold = None
                progress = True
        for t in [t for t, q in self._queues.items() if not q]:
            self._forget(t)
        if first_served in self._queues:            # the tenant served first goes to the back of the turn
            self._queues[first_served] = self._queues.pop(first_served)
        return [(item, n, tokens) for item, (n, tokens) in granted.items()]

    def _fits(self, w: _Waiting[T]) -> bool:
        b = self.budget
        return (self._total.rows + 1 <= b.max_rows and self._total.tokens + w.row_tokens <= b.max_tokens
                and (self._alone(w.tenant) or self._fits_share(w)))

    def _alone(self, tenant: str) -> bool:
        """No other tenant has work now or had within `borrow_after_s` (pruned at each `admit`)."""
        return all(t == tenant for t in (*self._queues, *self._usage, *self._idle_since))

    def _fits_share(self, w: _Waiting[T]) -> bool:
        rows, tokens = self.usage(w.tenant)
        return rows + 1 <= self.budget.tenant_rows and tokens + w.row_tokens <= self.budget.tenant_tokens

    def _starving(self, now: float, eligible: Callable[[T], bool] | None) -> _Waiting[T] | None:
        """The oldest waiting head past `max_overtake_s` that only the others' rows keep out, if any."""
        heads = [q[0] for q in self._queues.values() if q and (eligible is None or eligible(q[0].item))]
        old = [w for w in heads if now - w.since >= self.budget.max_overtake_s and not self._fits(w)
               and self._fits_share(w)]
        return min(old, key=lambda w: w.since) if old else None

    def _charge(self, w: _Waiting[T]) -> None:
        u = self._usage.setdefault(w.tenant, _Usage())
        u.rows += 1
        u.tokens += w.row_tokens
        self._total.rows += 1
        self._total.tokens += w.row_tokens

    def _forget(self, tenant: str) -> None:
        del self._queues[tenant]
        u = self._usage.get(tenant)
        if u is None or u.rows == 0:
            self._usage.pop(tenant, None)
            self._idle_since[tenant] = self.clock()
