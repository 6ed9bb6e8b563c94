"""Topics + client records + trainer checkpoints --> the chaos run's figures, each an invariant or a count.

What "exactly once" means here (docs/architecture.md §5, the inference and grader READMEs): producers are
idempotent and every event id is deterministic, consumers commit after their effect is durable and make
effects idempotent by event id. So the contract is an exactly-once *effect* over at-least-once
*delivery*: a record may be delivered twice (a spool replay after a kill -9 re-sends one whose
acknowledgement was lost) and must then carry the same event id; two different event ids for one
interaction (or for one graded revision) would be two effects, which nothing downstream can undo.
The checks count records, never dedupe them first: duplicate deliveries are reported on their own line
(and fail the run under `strict_delivery`), duplicate effects always fail it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.contracts.events import UndecodableEvent, decode
from shared.proto.apprentice.v1 import events_pb2

GRACE_S = 2.0
"""A fault's window extends this long after the service answered again (clients reconnecting)."""


@dataclass
class Figure:
    section: str
    name: str
    value: Any
    ok: bool | None = None         # None: reported, not an invariant

    def row(self) -> str:
        mark = "" if self.ok is None else ("ok" if self.ok else "FAILED")
        return f"{self.section:<12} {self.name:<62} {self.value!s:>10}  {mark}"


@dataclass
class Window:
    """[start, end] in wall-clock seconds: a fault (a killed service, the broker down) or a weight swap."""
    kind: str                      # kill | broker | swap
    target: str                    # service name, "broker", or the version swapped to
    start: float
    end: float

    def overlaps(self, start: float, end: float) -> bool:
        return start <= self.end and end >= self.start


def _decode_all(msg_type: Any, records: Iterable[Any]) -> list[Any]:
    out = []
    for m in records:
        try:
            out.append(decode(msg_type, m.value()))
        except UndecodableEvent:
            continue
    return out


# --- interactions ------------------------------------------------------------------------------------
def check_interactions(served: dict[str, Any], records: Sequence[Any], *, strict_delivery: bool) -> list[Figure]:
    """Every interaction id a client received appears in `interactions` with exactly one event id."""
    events: dict[str, list[str]] = defaultdict(list)
    for it in _decode_all(events_pb2.Interaction, records):
        events[it.interaction_id].append(it.envelope.event_id)
    missing = [i for i in served if i not in events]
    dup_effects = [i for i, ev in events.items() if len(set(ev)) > 1]
    dup_deliveries = sum(len(ev) - len(set(ev)) for ev in events.values())
    orphans = [i for i in events if i not in served]
    s = "interactions"
    return [
        Figure(s, "answers received by clients", len(served)),
        Figure(s, "records on the topic", len(records)),
        Figure(s, "received answers missing from the topic", len(missing), not missing),
        Figure(s, "interaction ids with >1 event id (duplicate effects)", len(dup_effects), not dup_effects),
        Figure(s, "extra copies of one event (duplicate deliveries)", dup_deliveries,
               dup_deliveries == 0 if strict_delivery else None),
        Figure(s, "captured, answer never reached a client (in flight at a kill)", len(orphans)),
    ]


# --- feedback ----------------------------------------------------------------------------------------
def check_feedback(served: dict[str, Any], records: Sequence[Any], *, strict_delivery: bool) -> list[Figure]:
    """Every feedback event the Feedback service acknowledged is on `feedback` (clients retry with the
    same occurred_at, so a retried submission has the same event id and is a delivery, not an effect)."""
    events = Counter(f.envelope.event_id for f in _decode_all(events_pb2.FeedbackEvent, records))
    acked = {e for s in served.values() for e in s.feedback_ids}
    missing = acked - set(events)
    dup_deliveries = sum(n - 1 for n in events.values())
    s = "feedback"
    return [
        Figure(s, "records on the topic", len(records)),
        Figure(s, "acknowledged events missing from the topic", len(missing), not missing),
        Figure(s, "extra copies of one event (duplicate deliveries)", dup_deliveries,
               dup_deliveries == 0 if strict_delivery else None),
    ]


# --- graded ------------------------------------------------------------------------------------------
def _content(g: events_pb2.GradedInteraction) -> str:
    """The grader's own notion of a revision's content (services/grader/core/join.py `_build`): reward,
    signal, reason, components and the feedback joined. Two revisions with equal content are one effect
    emitted twice."""
    src = json.dumps([round(g.reward, 9), g.has_signal, g.no_signal_reason,
                      [(c.name, round(c.value, 9), c.has_signal) for c in g.components],
                      [f.envelope.event_id for f in g.feedback]], separators=(",", ":"))
    return hashlib.sha1(src.encode()).hexdigest()


def check_graded(served: dict[str, Any], records: Sequence[Any], *, strict_delivery: bool) -> list[Figure]:
    """Each received answer is graded; each (interaction, revision) reaches the topic once; no revision
    repeats its predecessor's content; revisions are 1..n without gaps; the newest revision joined every
    feedback event the Feedback service acknowledged."""
    copies: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    latest: dict[str, events_pb2.GradedInteraction] = {}
    for g in _decode_all(events_pb2.GradedInteraction, records):
        iid = g.interaction.interaction_id
        copies[(iid, g.revision)].append((g.envelope.event_id, _content(g)))
        if iid not in latest or g.revision > latest[iid].revision:
            latest[iid] = g
    ungraded = [i for i in served if i not in latest]
    dup_effects = [k for k, v in copies.items() if len(set(v)) > 1]
    dup_deliveries = sum(len(v) - 1 for v in copies.values() if len(set(v)) == 1)
    revisions: dict[str, dict[int, str]] = defaultdict(dict)
    for (iid, rev), v in copies.items():
        revisions[iid][rev] = v[0][1]
    repeated = sum(1 for revs in revisions.values() for r in revs if r - 1 in revs and revs[r] == revs[r - 1])
    gaps = [i for i, revs in revisions.items() if set(revs) != set(range(1, max(revs) + 1))]
    feedback_lost = sum(len(set(s.feedback_ids) - {f.envelope.event_id for f in latest[i].feedback})
                        for i, s in served.items() if i in latest)
    feedback_acked = sum(len(set(s.feedback_ids)) for s in served.values())
    s = "graded"
    return [
        Figure(s, "records on the topic", len(records)),
        Figure(s, "(interaction, revision) pairs", len(copies)),
        Figure(s, "interactions with a revision >= 2 (late feedback)", sum(1 for r in revisions.values() if len(r) > 1)),
        Figure(s, "received answers never graded", len(ungraded), not ungraded),
        Figure(s, "(interaction, revision) with >1 event id or content", len(dup_effects), not dup_effects),
        Figure(s, "revisions repeating the previous content (duplicate effects)", repeated, repeated == 0),
        Figure(s, "interactions with a missing revision (lost emission)", len(gaps), not gaps),
        Figure(s, "extra copies of one revision (duplicate deliveries)", dup_deliveries,
               dup_deliveries == 0 if strict_delivery else None),
        Figure(s, "feedback events acknowledged to clients", feedback_acked),
        Figure(s, "acknowledged feedback missing from the newest revision", feedback_lost, feedback_lost == 0),
    ]


# --- training ----------------------------------------------------------------------------------------
def check_training(tenant: str, trainer_dir: Path, interactions: Sequence[Any], checkpoint_records: Sequence[Any],
                   manifests: Sequence[Any], *, min_versions: int) -> list[Figure]:
    """No interaction is in the weights twice. The trainer writes each round's `trained_ids` into its
    checkpoint's state.json and names the checkpoint in the version's manifest
    (`training_metadata.checkpoint_id`) and in published.json; every version it announced or stored is
    traced back to its checkpoint and the ids of all of them are counted together."""
    ckpt_dir = trainer_dir / "ckpts"
    published: dict[str, dict[str, str]] = {}
    if (trainer_dir / "published.json").exists():
        published = json.loads((trainer_dir / "published.json").read_text())
    by_version: dict[str, set[str]] = defaultdict(set)      # version -> checkpoint ids naming it
    for ckpt_id, rec in published.items():
        by_version[rec["version"]].add(ckpt_id)
    stored = [m for m in manifests if m.tenant == tenant and m.training_metadata.get("checkpoint_id")]
    for m in stored:
        by_version[m.version].add(m.training_metadata["checkpoint_id"])
    announced = [c for c in _decode_all(events_pb2.CheckpointPublished, checkpoint_records) if c.tenant == tenant]
    for c in announced:
        by_version.setdefault(c.version, set())
    uploads_per_ckpt = Counter(m.training_metadata["checkpoint_id"] for m in stored)
    trained: Counter[str] = Counter()
    unverifiable = 0
    for _version, ckpts in by_version.items():
        if len(ckpts) != 1 or not (ckpt_dir / next(iter(ckpts)) / "state.json").exists():
            unverifiable += 1
            continue
        state = json.loads((ckpt_dir / next(iter(ckpts)) / "state.json").read_text())
        trained.update(state.get("trained_ids", []))
    twice = [i for i, n in trained.items() if n > 1]
    tenant_ids = {it.interaction_id for it in _decode_all(events_pb2.Interaction, interactions)
                  if (it.envelope.tenant or "default") == tenant}
    foreign = [i for i in trained if i not in tenant_ids]
    unpublished = 0
    if ckpt_dir.exists():
        unpublished = sum(1 for p in ckpt_dir.iterdir() if p.name.startswith("ckpt-") and p.name not in published)
    s = "training"
    return [
        Figure(s, f"versions trained for tenant {tenant!r}", len(by_version), len(by_version) >= min_versions),
        Figure(s, "interactions trained", len(trained)),
        Figure(s, "versions not traceable to exactly one checkpoint", unverifiable, unverifiable == 0),
        Figure(s, "checkpoints uploaded as more than one version", sum(1 for n in uploads_per_ckpt.values() if n > 1),
               all(n == 1 for n in uploads_per_ckpt.values())),
        Figure(s, "interactions trained twice", len(twice), not twice),
        Figure(s, "trained ids that are not this tenant's interactions", len(foreign), not foreign),
        Figure(s, "checkpoints never published (a round lost to a kill)", unpublished),
    ]


# --- requests ----------------------------------------------------------------------------------------
def swap_windows(update_records: Sequence[Any], attempts: Sequence[Any], tenants: Sequence[str]) -> list[Window]:
    """When the served version changed under load. Two sources, united: each ModelUpdate order, from its
    broker timestamp until a client first got an answer from that version (60 s at most); and, per
    tenant, each change of the answering version between consecutive answers (this also covers the
    catch-up swaps of an inference pod that restarted on the base model)."""
    oks = sorted((a for a in attempts if a.kind == "generate" and a.code == "OK"), key=lambda a: a.end)
    windows: list[Window] = []
    for m in update_records:
        try:
            u = decode(events_pb2.ModelUpdate, m.value())
        except UndecodableEvent:
            continue
        t = m.timestamp()[1] / 1000.0
        target = u.version or "base"
        firsts = [a.end for a in oks if a.end >= t and a.version == target and (not u.tenant or a.tenant == u.tenant)]
        windows.append(Window("swap", target, t - 0.5, (firsts[0] if firsts else t + 60.0) + 1.0))
    for tenant in tenants:
        prev = None
        for a in (a for a in oks if a.tenant == tenant):
            if prev is not None and a.version != prev.version:
                windows.append(Window("swap", a.version, prev.end, a.end))
            prev = a
    return windows


def classify(attempt: Any, faults: Sequence[Window], swaps: Sequence[Window]) -> str:
    """Why a failed call failed, in order of precedence: the inference process itself was killed
    (expected: the answer died with it), a weight swap, the broker down, another service killed, none."""
    a0, a1 = attempt.start, attempt.end
    if any(f.target.split("-", 1)[0] == "inference" and f.overlaps(a0, a1) for f in faults):
        return "inference killed"
    if any(w.overlaps(a0, a1) for w in swaps):
        return "during a swap"
    if any(f.kind == "broker" and f.overlaps(a0, a1) for f in faults):
        return "broker down"
    if any(f.overlaps(a0, a1) for f in faults):
        return "other service killed"
    return "no fault"


def check_requests(attempts: Sequence[Any], failed_for_good: Counter[str], faults: Sequence[Window],
                   swaps: Sequence[Window], *, min_swaps: int) -> list[Figure]:
    """Client-side: failed calls split by cause. Only calls that overlapped the killed inference process
    may fail (and the clients retried them); none may fail during a swap, the broker outage, another
    service's restart, or without a fault; no call may fail for good."""
    faults = [Window(f.kind, f.target, f.start, f.end + GRACE_S) for f in faults]
    failed = [a for a in attempts if a.code != "OK"]
    causes = Counter((a.kind, classify(a, faults, swaps)) for a in failed)
    codes = Counter(a.code for a in failed)
    gen_ok = [a for a in attempts if a.kind == "generate" and a.code == "OK"]
    during_swap = sum(1 for a in gen_ok if any(w.overlaps(a.start, a.end) for w in swaps))
    s = "requests"
    figs = [
        Figure(s, "Generate answered", len(gen_ok)),
        Figure(s, "Feedback acknowledged", sum(1 for a in attempts if a.kind == "feedback" and a.code == "OK")),
        Figure(s, "weight swaps seen under load", len(swaps), len(swaps) >= min_swaps),
        Figure(s, "Generate answered during a swap", during_swap, during_swap > 0 if min_swaps else None),
        Figure(s, "failed calls, status codes", dict(codes) or "none"),
    ]
    for kind in ("generate", "feedback"):
        for cause in ("inference killed", "during a swap", "broker down", "other service killed", "no fault"):
            n = causes.get((kind, cause), 0)
            figs.append(Figure(s, f"failed {kind} calls: {cause}", n, None if cause == "inference killed" else n == 0))
    figs.append(Figure(s, "calls failed for good (after retries)", sum(failed_for_good.values()),
                       not sum(failed_for_good.values())))
    return figs


def print_table(figures: Sequence[Figure]) -> str:
    lines = [f"{'section':<12} {'figure':<62} {'value':>10}  invariant", "-" * 98]
    lines += [f.row() for f in figures]
    return "\n".join(lines)
