"""GradedInteraction records of one tenant --> batches of trainable Rollouts (the RL buffer).

The trainer's intake of records from Kafka: each record passes the trainer's one filter (`admit`,
rollouts.py: tenant, quarantine, signal, well-formed) here and nowhere else, the rounds train what this
buffer releases as they are. Skips, in order, each counted under its reason:
- other_tenant   the record belongs to another tenant (strict isolation: never trained here)
- malformed      no interaction id (nothing else can be read of it)
- older_revision a lower revision than one already seen for the interaction
- already_trained the interaction was trained (at most once per interaction)
- quarantined / no_signal / malformed  the grader flagged reward hacking or could not judge (masked,
                 not 0), or the record has no prompt or response tokens
- unknown_version / stale  the producing policy is not in this trainer's lineage, or more than
                 `max_staleness` trainer versions old
- in_trajectory  an earlier turn of an agent trajectory this buffer accepted (the trajectory holds its
                 tokens, rewarded by the session's outcome: docs/agents.md); a pending one is withdrawn

Revision semantics: the grader re-emits an interaction with a higher revision when late feedback
changes its reward. Until the interaction is trained, the highest revision replaces the pending one
(if it turned no-signal, quarantined or malformed, the pending one is withdrawn: "revoked"). Once trained, later
revisions are skipped: each interaction is trained at most once, on the first revision that was usable
when a round took it.

Groups: the n samples of one request share `group_id`; a group is released when every sibling was
seen (usable or not) or after `group_wait_s`, so one lost sibling never blocks the others.
"""

from __future__ import annotations

import base64
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from services.trainer.rollouts import OTHER_TENANT, Rollout, admit, from_graded
from shared.proto.apprentice.v1 import events_pb2

ACCEPTED = "accepted"


@dataclass
class _Pending:
    rollout: Rollout
    raw: bytes           # the GradedInteraction, kept to persist the buffer in checkpoints
    partition: int
    offset: int
    arrived: float


@dataclass
class _Group:
    size: int
    first_seen: float
    seen: set[str] = field(default_factory=set)


class RolloutBuffer:
    def __init__(self, tenant: str, *, max_staleness: int = 4, group_wait_s: float = 120.0) -> None:
        self.tenant = tenant
        self.max_staleness = max_staleness
        self.group_wait_s = group_wait_s
        self.lineage: list[str] = ["base"]          # versions this trainer produced, oldest first
        self.trained: dict[str, int] = {}            # interaction id -> lineage index of its policy
        self.revisions: dict[str, int] = {}          # interaction id -> highest revision seen (pending ones)
        self.pending: dict[str, _Pending] = {}
        self.covered: dict[str, int] = {}            # earlier turns of accepted trajectories -> lineage index
        self.groups: dict[str, _Group] = {}
        self.skipped: Counter[str] = Counter()

    # --- versions -------------------------------------------------------------------------------------
    def staleness(self, version: str) -> int | None:
        """Trainer versions published since `version` (0 = current); None if not in the lineage."""
        try:
            return len(self.lineage) - 1 - self.lineage.index(version or "base")
        except ValueError:
            return None

    def advance(self, version: str) -> None:
        """A new version of this lineage exists: staleness of everything grows by one."""
        if version not in self.lineage:
            self.lineage.append(version)
        horizon = len(self.lineage) - 1 - self.max_staleness
        self.trained = {k: v for k, v in self.trained.items() if v >= horizon}
        self.covered = {k: v for k, v in self.covered.items() if v >= horizon}

    # --- intake ---------------------------------------------------------------------------------------
    def offer(self, g: events_pb2.GradedInteraction, now: float, *, partition: int = -1, offset: int = -1) -> str:
        """Consider one graded record; returns "accepted" or the reason it was skipped."""
        reason = self._offer(g, now, partition, offset)
        if reason != ACCEPTED:
            self.skipped[reason] += 1
        return reason

    def _offer(self, g: events_pb2.GradedInteraction, now: float, partition: int, offset: int) -> str:
        verdict = admit(g, self.tenant)
        iid = g.interaction.interaction_id
        if verdict.reason == OTHER_TENANT or not iid:
            return verdict.reason
        if g.revision < self.revisions.get(iid, 0):
            return "older_revision"
        if iid in self.trained:
            return "already_trained"
        if iid in self.covered:
            return "in_trajectory"
        it = g.interaction
        if it.group_id and it.group_size > 1:
            grp = self.groups.setdefault(it.group_id, _Group(size=it.group_size, first_seen=now))
            grp.seen.add(iid)
        self.revisions[iid] = g.revision
        rollout = verdict.rollout
        if rollout is None:             # the newest revision may not train: the pending one is withdrawn
            if self.pending.pop(iid, None) is not None:
                self.skipped["revoked"] += 1
            return verdict.reason
        st = self.staleness(rollout.policy_version)
        if st is None:
            return "unknown_version"
        if st > self.max_staleness:
            return "stale"
        self.pending[iid] = _Pending(rollout, g.SerializeToString(), partition, offset, now)
        for earlier in it.trajectory.interaction_ids:
            self.covered[earlier] = len(self.lineage) - 1
            if self.pending.pop(earlier, None) is not None:
                self.skipped["in_trajectory"] += 1
        return ACCEPTED

    # --- release --------------------------------------------------------------------------------------
    def ready(self, now: float) -> list[Rollout]:
        """Rollouts that may be trained now, in arrival order: singles, and the usable members of groups
        that are complete or waited long enough. Stale ones are dropped here (the lineage moves on)."""
        for iid in [i for i, p in self.pending.items() if (self.staleness(p.rollout.policy_version) or 0) > self.max_staleness]:
            del self.pending[iid]
            self.skipped["stale"] += 1
        out: list[_Pending] = []
        for p in self.pending.values():
            r = p.rollout
            if not r.grouped:
                out.append(p)
                continue
            grp = self.groups.get(r.group_id)
            if grp is None or len(grp.seen) >= grp.size or now - grp.first_seen >= self.group_wait_s:
                out.append(p)
        out.sort(key=lambda p: (p.arrived, p.partition, p.offset))
        waiting = {p.rollout.group_id for p in self.pending.values() if p.rollout.grouped}
        for gid in [g for g, grp in self.groups.items()
                    if g not in waiting and now - grp.first_seen >= self.group_wait_s]:
            del self.groups[gid]          # every member trained or unusable, and no sibling is due any more
        return [p.rollout for p in out]

    def take(self, rollouts: list[Rollout]) -> None:
        """Mark rollouts trained: they leave the buffer and later revisions are skipped."""
        for r in rollouts:
            self.pending.pop(r.interaction_id, None)
            self.revisions.pop(r.interaction_id, None)
            idx = self.lineage.index(r.policy_version) if r.policy_version in self.lineage else len(self.lineage) - 1
            self.trained[r.interaction_id] = idx
            grp = self.groups.get(r.group_id) if r.grouped else None
            if grp is not None and len(grp.seen) >= grp.size and not any(
                    p.rollout.group_id == r.group_id for p in self.pending.values()):
                del self.groups[r.group_id]

    def __len__(self) -> int:
        return len(self.pending)

    # --- persistence (inside checkpoints) -----------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        return {
            "lineage": self.lineage, "trained": self.trained, "revisions": self.revisions, "covered": self.covered,
            "pending": [{"raw": base64.b64encode(p.raw).decode(), "partition": p.partition, "offset": p.offset,
                         "arrived": p.arrived} for p in self.pending.values()],
            "groups": {k: {"size": g.size, "first_seen": g.first_seen, "seen": sorted(g.seen)}
                       for k, g in self.groups.items()},
            "skipped": dict(self.skipped),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.lineage = list(state.get("lineage", ["base"]))
        self.trained = {k: int(v) for k, v in state.get("trained", {}).items()}
        self.revisions = {k: int(v) for k, v in state.get("revisions", {}).items()}
        self.covered = {k: int(v) for k, v in state.get("covered", {}).items()}
        self.pending = {}
        for p in state.get("pending", []):
            raw = base64.b64decode(p["raw"])
            g = events_pb2.GradedInteraction.FromString(raw)
            self.pending[g.interaction.interaction_id] = _Pending(from_graded(g), raw, int(p["partition"]),
                                                                  int(p["offset"]), float(p["arrived"]))
        self.groups = {k: _Group(int(v["size"]), float(v["first_seen"]), set(v["seen"]))
                       for k, v in state.get("groups", {}).items()}
        self.skipped = Counter(state.get("skipped", {}))
