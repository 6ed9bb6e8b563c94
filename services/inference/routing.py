"""ModelUpdate orders --> a routing table; (tenant, uniform draw) --> the version that serves a request.

Pure state, no I/O (the version manager downloads and loads what a table needs, then publishes it).
The table has one *slot* per tenant that owns versions, plus the operator slot `""` that applies to
every tenant without a slot of its own (TEAM.md tenancy rule: a tenant-owned version serves only that
tenant). Each slot has a promoted version and optionally a canary with the fraction of the slot's
requests it serves.

Orders (events.proto `ModelUpdate`), for slot t = update.tenant:
- PROMOTE v:  t serves v; a canary of v in t ends (it graduated).
- CANARY v f: f of t's requests go to v (f <= 0 ends the canary).
- ROLLBACK v: t serves v (or `previous_version`, or what t served before, or the base); t's canary ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from shared.proto.apprentice.v1 import events_pb2

BASE = "base"
OPERATOR = ""
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class InvalidOrder(ValueError):
    """A ModelUpdate that cannot be applied (missing version, unknown action): logged and skipped."""


@dataclass(frozen=True)
class Slot:
    promoted: str = ""             # "" in a tenant slot = inherit the operator slot's version
    canary: str = ""
    fraction: float = 0.0
    history: tuple[str, ...] = ()  # previously promoted versions, newest last (rollback targets)

    @property
    def empty(self) -> bool:
        return not self.promoted and not self.canary


@dataclass(frozen=True)
class RoutingTable:
    slots: dict[str, Slot] = field(default_factory=lambda: {OPERATOR: Slot(promoted=BASE)})

    # --- reading ----------------------------------------------------------------------------------
    def choose(self, tenant: str, u: float) -> tuple[str, bool]:
        """(version, is_canary) for a request of `tenant`, given a uniform draw u in [0, 1)."""
        own = self.slots.get(tenant) if tenant != OPERATOR else None
        if own is not None:
            if own.canary and u < own.fraction:
                return own.canary, True
            if own.promoted:
                return own.promoted, False
        op = self.slots.get(OPERATOR, Slot(promoted=BASE))
        if own is None and op.canary and u < op.fraction:
            return op.canary, True
        return op.promoted or BASE, False

    def versions(self) -> set[str]:
        """Every version some request may be routed to."""
        out: set[str] = set()
        for s in self.slots.values():
            out.update(v for v in (s.promoted, s.canary) if v)
        return out

    def tenant_versions(self) -> dict[str, str]:
        """Slot -> promoted version, `""` always present (PodHeartbeat.tenant_versions)."""
        out = {t: s.promoted for t, s in self.slots.items() if s.promoted}
        out.setdefault(OPERATOR, self.slots.get(OPERATOR, Slot(promoted=BASE)).promoted or BASE)
        return out

    def tenant_canaries(self) -> dict[str, tuple[str, float]]:
        return {t: (s.canary, s.fraction) for t, s in self.slots.items() if s.canary}

    def slots_using(self, version: str) -> list[str]:
        return sorted(t for t, s in self.slots.items() if version in (s.promoted, s.canary))

    # --- orders -----------------------------------------------------------------------------------
    def apply(self, update: events_pb2.ModelUpdate) -> RoutingTable:
        """The table after one order (a new object; this one is unchanged)."""
        t = update.tenant
        for v in (update.version, update.previous_version):
            if v and not _VERSION_RE.match(v):
                raise InvalidOrder(f"version {v[:60]!r} is not a version name (letters, digits, '.', '_', '-')")
        slot = self.slots.get(t, Slot(promoted=BASE if t == OPERATOR else ""))
        action = update.action
        if action == events_pb2.UPDATE_ACTION_PROMOTE:
            if not update.version:
                raise InvalidOrder("PROMOTE without a version")
            history = slot.history + ((slot.promoted,) if slot.promoted and slot.promoted != update.version else ())
            new = replace(slot, promoted=update.version, history=history[-8:])
            if new.canary == update.version:
                new = replace(new, canary="", fraction=0.0)
        elif action == events_pb2.UPDATE_ACTION_CANARY:
            if not update.version:
                raise InvalidOrder("CANARY without a version")
            f = min(max(update.canary_fraction, 0.0), 1.0)
            new = replace(slot, canary=update.version if f > 0 else "", fraction=f if f > 0 else 0.0)
        elif action == events_pb2.UPDATE_ACTION_ROLLBACK:
            target = update.version or update.previous_version
            past = list(slot.history)
            if not target:
                target = past.pop() if past else (BASE if t == OPERATOR else "")
            elif target in past:
                past = past[:past.index(target)]
            new = Slot(promoted=target, history=tuple(past))
        else:
            raise InvalidOrder(f"unknown action {action}")
        slots = dict(self.slots)
        if t != OPERATOR and new.empty:
            slots.pop(t, None)
        else:
            slots[t] = new
        return RoutingTable(slots)

    def revert(self, failed: set[str], previous: RoutingTable) -> RoutingTable:
        """This table with every reference to a `failed` version replaced by what `previous` had there
        (a failed load keeps the old version)."""
        slots = dict(self.slots)
        for t, s in self.slots.items():
            old = previous.slots.get(t, Slot(promoted=BASE if t == OPERATOR else ""))
            if s.promoted in failed:
                s = replace(s, promoted=old.promoted if old.promoted not in failed else "", history=old.history)
            if s.canary in failed:
                s = replace(s, canary=old.canary if old.canary not in failed else "",
                            fraction=old.fraction if old.canary not in failed else 0.0)
            if t != OPERATOR and s.empty:
                slots.pop(t, None)
            else:
                slots[t] = s
        return RoutingTable(slots)
