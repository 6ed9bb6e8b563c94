"""Graded interactions and model-update orders --> the in-memory aggregates the pages draw (no network).

The graded topic carries one record per revision of an interaction (late feedback re-grades it), so the
fold keeps the highest revision per interaction id and computes every curve from those: a re-graded
interaction moves from "no signal" to its reward instead of being counted twice. Curves are bucketed by
the time the interaction was served (its envelope's `occurred_at`), so a late revision lands in the bucket
of the answer it judges, split by the policy version that produced it: a new version's curve starts where
its traffic starts.

Memory is bounded: the newest `max_interactions` interactions are kept (oldest evicted first), and each
tenant keeps only its newest flagged examples.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shared.proto.apprentice.v1 import events_pb2

UPDATE_ACTIONS = {events_pb2.UPDATE_ACTION_PROMOTE: "promote", events_pb2.UPDATE_ACTION_CANARY: "canary",
                  events_pb2.UPDATE_ACTION_ROLLBACK: "rollback"}
TEXT_CHARS = 400
"""Prompt and response text kept per example (the page shows an excerpt; the topic has the rest)."""


TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Time-axis tick steps: whole seconds, minutes, hours, a day (longer spans: whole days)."""
MAX_TICKS = 8


def ms(t: float) -> int:
    """Seconds since the epoch (UTC, as envelopes carry them) --> milliseconds since the epoch, what the
    browser's `Date` takes; it shows them in the viewer's own time zone."""
    return round(t * 1000)


def time_axis(starts: Iterable[float], bucket_s: float, *, now: float | None = None) -> dict[str, int]:
    """The x axis of a chart of the buckets starting at `starts` (seconds since the epoch), each point drawn
    at its bucket's start, in ms since the epoch: `min`/`max` half a bucket beyond the first and last bucket,
    a lone bucket a whole bucket either side (the axis spans minutes around it, not the years a zero-width
    range would be widened to), no bucket the current one; `step` a tick step of whole seconds, minutes,
    hours or days giving at most MAX_TICKS ticks; `bucket` the bucket width."""
    ts = sorted(starts)
    if not ts:
        now = time.time() if now is None else now
        ts = [(now // bucket_s) * bucket_s]
    pad = bucket_s if ts[0] == ts[-1] else bucket_s / 2
    lo, hi = ts[0] - pad, ts[-1] + pad
    span = hi - lo
    step = next((s for s in TICK_STEPS_S if span / s <= MAX_TICKS), 0) or 86400 * math.ceil(span / 86400 / MAX_TICKS)
    return {"min": ms(lo), "max": ms(hi), "step": step * 1000, "bucket": ms(bucket_s)}


@dataclass(frozen=True)
class GradedPoint:
    """What the curves need of one graded interaction (its highest revision seen)."""

    interaction_id: str
    revision: int
    tenant: str
    task: str
    policy_version: str
    served_at: float
    reward: float
    has_signal: bool
    success: bool
    response_tokens: int
    flags: tuple[str, ...]
    quarantined: bool
    canary: bool


@dataclass(frozen=True)
class Example:
    """A flagged or quarantined interaction, as the reward-hacking page shows it."""

    interaction_id: str
    tenant: str
    task: str
    policy_version: str
    served_at: float
    reward: float
    flags: tuple[str, ...]
    quarantined: bool
    prompt: str
    response: str


def _ts(envelope: Any) -> float:
    t = envelope.occurred_at
    return float(t.seconds) + t.nanos / 1e9


def _last_user_message(it: events_pb2.Interaction) -> str:
    for m in reversed(it.messages):
        if m.role == "user":
            return m.content
    return it.prompt_text


def point_of(g: events_pb2.GradedInteraction) -> GradedPoint:
    it = g.interaction
    served = _ts(it.envelope) or _ts(g.envelope)
    return GradedPoint(interaction_id=it.interaction_id, revision=g.revision,
                       tenant=g.envelope.tenant or it.envelope.tenant, task=it.task or "-",
                       policy_version=it.policy_version or "base", served_at=served, reward=g.reward,
                       has_signal=g.has_signal, success=g.success,
                       response_tokens=len(it.response_token_ids), flags=tuple(g.flags),
                       quarantined=g.quarantined, canary=it.canary)


@dataclass
class _Bucket:
    n: int = 0
    signal: int = 0
    reward_sum: float = 0.0
    success: int = 0
    tokens_sum: int = 0
    flagged: int = 0
    quarantined: int = 0

    def add(self, p: GradedPoint) -> None:
        self.n += 1
        self.tokens_sum += p.response_tokens
        self.success += int(p.success)
        if p.has_signal:
            self.signal += 1
            self.reward_sum += p.reward
        self.flagged += int(bool(p.flags))
        self.quarantined += int(p.quarantined)


class GradedFold:
    """The graded topic folded into per-(tenant, task) curves. Thread-safe: the reader thread adds, the
    web handlers read."""

    def __init__(self, *, bucket_s: float = 60.0, max_interactions: int = 50_000, examples: int = 20) -> None:
        if bucket_s <= 0:
            raise ValueError("bucket_s must be positive")
        self.bucket_s = bucket_s
        self.max_interactions = max_interactions
        self._points: OrderedDict[str, GradedPoint] = OrderedDict()
        self._examples: dict[str, deque[Example]] = defaultdict(lambda: deque(maxlen=examples))
        self._lock = threading.Lock()
        self.records = 0
        """Graded records folded (every revision), for the health page."""

    def add(self, g: events_pb2.GradedInteraction) -> bool:
        """Fold one record; False when it is an older (or repeated) revision of a known interaction."""
        p = point_of(g)
        if not p.interaction_id:
            return False
        with self._lock:
            self.records += 1
            known = self._points.get(p.interaction_id)
            if known is not None and known.revision >= p.revision:
                return False
            self._points[p.interaction_id] = p
            self._points.move_to_end(p.interaction_id)
            while len(self._points) > self.max_interactions:
                self._points.popitem(last=False)
            if p.flags or p.quarantined:
                it = g.interaction
                examples = self._examples[p.tenant]
                for i, old in enumerate(examples):    # a new revision replaces its older one
                    if old.interaction_id == p.interaction_id:
                        del examples[i]
                        break
                examples.append(Example(
                    interaction_id=p.interaction_id, tenant=p.tenant, task=p.task, policy_version=p.policy_version,
                    served_at=p.served_at, reward=p.reward, flags=p.flags, quarantined=p.quarantined,
                    prompt=_last_user_message(it)[:TEXT_CHARS], response=it.response_text[:TEXT_CHARS]))
        return True

    def _snapshot(self, tenant: str | None) -> list[GradedPoint]:
        with self._lock:
            return [p for p in self._points.values() if tenant is None or p.tenant == tenant]

    def tenants(self) -> dict[str, list[str]]:
        """tenant -> its tasks, sorted."""
        out: dict[str, set[str]] = defaultdict(set)
        for p in self._snapshot(None):
            out[p.tenant].add(p.task)
        return {t: sorted(tasks) for t, tasks in sorted(out.items())}

    def _bucket_of(self, t: float) -> float:
        return (t // self.bucket_s) * self.bucket_s

    def curves(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Per (tenant, task): one series per policy version of (bucket start in seconds `t` and in ms since
        the epoch `ms`, interactions, mean reward over those with signal, success rate, mean response
        tokens), buckets in time order; `axis`: the time axis over every version's buckets (time_axis)."""
        grouped: dict[tuple[str, str], dict[str, dict[float, _Bucket]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(_Bucket)))
        for p in self._snapshot(tenant):
            grouped[(p.tenant, p.task)][p.policy_version][self._bucket_of(p.served_at)].add(p)
        out = []
        for (ten, task), versions in sorted(grouped.items()):
            series = []
            for version, buckets in sorted(versions.items()):
                points = [{"t": t, "ms": ms(t), "n": b.n, "with_signal": b.signal,
                           "reward": b.reward_sum / b.signal if b.signal else None,
                           "success": b.success / b.n, "tokens": b.tokens_sum / b.n}
                          for t, b in sorted(buckets.items())]
                series.append({"version": version, "points": points,
                               "n": sum(b.n for b in buckets.values())})
            out.append({"tenant": ten, "task": task, "series": series, "axis": time_axis(
                {t for buckets in versions.values() for t in buckets}, self.bucket_s)})
        return out

    def hacking(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Per tenant: flagged and quarantined counts per bucket (start `t` in seconds, `ms` in ms since the
        epoch), its time `axis` (time_axis), totals per detector flag, and the newest flagged examples
        (newest first)."""
        per: dict[str, dict[float, _Bucket]] = defaultdict(lambda: defaultdict(_Bucket))
        flags: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        totals: dict[str, _Bucket] = defaultdict(_Bucket)
        for p in self._snapshot(tenant):
            per[p.tenant][self._bucket_of(p.served_at)].add(p)
            totals[p.tenant].add(p)
            for f in p.flags:
                flags[p.tenant][f] += 1
        with self._lock:
            examples = {t: list(reversed(ex)) for t, ex in self._examples.items() if tenant is None or t == tenant}
        out = []
        for ten in sorted(per):
            tot = totals[ten]
            out.append({
                "tenant": ten, "interactions": tot.n, "flagged": tot.flagged, "quarantined": tot.quarantined,
                "flags": dict(sorted(flags[ten].items())),
                "points": [{"t": t, "ms": ms(t), "n": b.n, "flagged": b.flagged, "quarantined": b.quarantined}
                           for t, b in sorted(per[ten].items())],
                "axis": time_axis(per[ten], self.bucket_s),
                "examples": [e.__dict__ | {"flags": list(e.flags)} for e in examples.get(ten, [])]})
        return out


@dataclass
class UpdatesFold:
    """The model-updates topic (every promote / canary / rollback order) as a timeline, newest last."""

    limit: int = 500
    orders: deque[dict[str, Any]] = field(default_factory=deque)
    _seen: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, u: events_pb2.ModelUpdate) -> bool:
        """Fold one order; False for a redelivered one (same event id)."""
        with self._lock:
            if u.envelope.event_id in self._seen:
                return False
            self._seen.add(u.envelope.event_id)
            canary = u.action == events_pb2.UPDATE_ACTION_CANARY
            self.orders.append({"event_id": u.envelope.event_id, "at": _ts(u.envelope),
                                "action": UPDATE_ACTIONS.get(u.action, "unknown"), "model": u.model,
                                "version": u.version, "previous": u.previous_version,
                                "fraction": u.canary_fraction if canary else None,
                                "tenant": u.tenant, "reason": u.reason,
                                "by": u.envelope.principal.key_id if u.envelope.HasField("principal") else ""})
            while len(self.orders) > self.limit:
                old = self.orders.popleft()
                self._seen.discard(old.get("event_id", ""))
        return True

    def timeline(self, model: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [o for o in self.orders if model is None or o["model"] == model]
