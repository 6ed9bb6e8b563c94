"""ModelUpdate orders --> a routing table; (tenant, uniform draw) --> the version that serves a request.

Pure state, no I/O (the version manager downloads and loads what a table needs, then publishes it).
What an order means for a slot (promote, canary, rollback) is shared/contracts/orders.py, the same rules the
weights service keeps its state by; this module adds the pod's role: choosing a version per request
(a canary serves its fraction of the slot's requests; the operator slot's canary does not reach
tenants with a slot of their own), dropping empty tenant slots, and reverting a failed load.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shared.contracts.orders import BASE, OPERATOR, Slot, apply_order, promoted_for
from shared.proto.apprentice.v1 import events_pb2

HISTORY_KEPT = 8
"""Rollback history a pod keeps per slot (bounded memory on a long-lived pod)."""


@dataclass(frozen=True)
class RoutingTable:
    slots: dict[str, Slot] = field(default_factory=lambda: {OPERATOR: Slot(promoted=BASE)})

    # --- reading ----------------------------------------------------------------------------------
    def choose(self, tenant: str, u: float) -> tuple[str, bool]:
        """(version, is_canary) for a request of `tenant`, given a uniform draw u in [0, 1)."""
        own = self.slots.get(tenant) if tenant != OPERATOR else None
        if own is not None and own.canary and u < own.canary_fraction:
            return own.canary, True
        op = self.slots.get(OPERATOR, Slot(promoted=BASE))
        if own is None and op.canary and u < op.canary_fraction:
            return op.canary, True
        return promoted_for(self.slots, tenant), False

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
        return {t: (s.canary, s.canary_fraction) for t, s in self.slots.items() if s.canary}

    def slots_using(self, version: str) -> list[str]:
        return sorted(t for t, s in self.slots.items() if version in (s.promoted, s.canary))

    # --- orders -----------------------------------------------------------------------------------
    def apply(self, update: events_pb2.ModelUpdate) -> RoutingTable:
        """The table after one order (a new object; this one is unchanged). Raises InvalidOrder."""
        t = update.tenant
        new = apply_order(self.slots.get(t, Slot(promoted=BASE if t == OPERATOR else "")), update)
        new = replace(new, history=new.history[-HISTORY_KEPT:])
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
                            canary_fraction=old.canary_fraction if old.canary not in failed else 0.0)
            if t != OPERATOR and s.empty:
                slots.pop(t, None)
            else:
                slots[t] = s
        return RoutingTable(slots)
