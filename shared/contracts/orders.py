"""The meaning of a model-update order (events.proto `ModelUpdate`): what one tenant slot serves after it.

Both ends hold the same slots: the weights service issues orders and keeps the authoritative state
(services/weights/orders.py), every inference pod applies them to its routing table
(services/inference/routing.py). One *slot* per tenant that owns versions, plus the operator slot `""`
that applies to every tenant without a slot of its own (a tenant-owned version serves only that tenant).

Orders, for slot t = update.tenant:
- PROMOTE v:  t serves v; the version it served before (`previous_version`, else its own promoted one)
              joins its rollback history; a canary of v in t ends (it graduated).
- CANARY v f: f of t's requests go to v (f is clamped to [0, 1]; f = 0 ends the canary).
- ROLLBACK v: t serves v (or `previous_version`, or the newest history entry, or the base in the
              operator slot); history from v's last occurrence on is dropped; t's canary ends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from shared.proto.apprentice.v1 import events_pb2

BASE = "base"
"""The version name of the base model's own weights."""
OPERATOR = ""
"""The operator slot: what every tenant without a slot of its own is served."""
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A version name an order may carry (it becomes a path component on pods)."""


class InvalidOrder(ValueError):
    """A ModelUpdate that cannot be applied (missing or malformed version, unknown action)."""


@dataclass(frozen=True)
class Slot:
    """What one tenant slot serves."""

    promoted: str = ""
    """The version this slot serves; "" = not set (a tenant slot follows the operator slot)."""
    history: tuple[str, ...] = ()
    """Previously promoted versions, oldest first: the rollback targets."""
    canary: str = ""
    canary_fraction: float = 0.0
    canary_started_at: float = 0.0
    """When the weights service started the canary (seconds since the epoch; 0 = unknown)."""

    @property
    def empty(self) -> bool:
        return not self.promoted and not self.canary


def validate_order(update: events_pb2.ModelUpdate) -> None:
    """Raise InvalidOrder unless `update` can be applied to a slot."""
    for v in (update.version, update.previous_version):
        if v and not VERSION_RE.match(v):
            raise InvalidOrder(f"version {v[:60]!r} is not a version name (letters, digits, '.', '_', '-')")
    if update.action not in (events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_CANARY,
                             events_pb2.UPDATE_ACTION_ROLLBACK):
        raise InvalidOrder(f"unknown action {update.action}")
    if update.action != events_pb2.UPDATE_ACTION_ROLLBACK and not update.version:
        raise InvalidOrder(f"{events_pb2.UpdateAction.Name(update.action).removeprefix('UPDATE_ACTION_')} "
                           "without a version")


def apply_order(slot: Slot, update: events_pb2.ModelUpdate) -> Slot:
    """The slot `update.tenant` after one order (a new object). `slot` is what that slot holds now
    (`Slot()` when it has none). Raises InvalidOrder (validate_order)."""
    validate_order(update)
    v = update.version
    if update.action == events_pb2.UPDATE_ACTION_PROMOTE:
        previous = update.previous_version or slot.promoted
        history = slot.history
        if previous and previous != v and (not history or history[-1] != previous):
            history = (*history, previous)
        new = replace(slot, promoted=v, history=history)
        return replace(new, canary="", canary_fraction=0.0) if new.canary == v else new
    if update.action == events_pb2.UPDATE_ACTION_CANARY:
        f = min(max(update.canary_fraction, 0.0), 1.0)
        return replace(slot, canary=v if f > 0 else "", canary_fraction=f if f > 0 else 0.0)
    target = v or update.previous_version
    past = list(slot.history)
    if not target:
        target = past.pop() if past else (BASE if update.tenant == OPERATOR else "")
    elif target in past:
        del past[len(past) - 1 - past[::-1].index(target):]
    return replace(slot, promoted=target, history=tuple(past), canary="", canary_fraction=0.0)


def promoted_for(slots: Mapping[str, Slot], tenant: str) -> str:
    """The version `tenant`'s requests get outside any canary: its own slot's promoted version, else the
    operator slot's, else the base."""
    own = slots.get(tenant)
    if own is not None and own.promoted:
        return own.promoted
    op = slots.get(OPERATOR)
    return op.promoted if op is not None and op.promoted else BASE
