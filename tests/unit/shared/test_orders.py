"""The meaning of a ModelUpdate order for a slot (shared/contracts/orders.py), by hand. That the two services that
apply it agree: tests/unit/weights/test_orders_agree.py."""

from __future__ import annotations

import pytest

from shared.contracts.orders import BASE, InvalidOrder, Slot, apply_order, promoted_for
from shared.proto.apprentice.v1 import events_pb2

P, C, R = events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_CANARY, events_pb2.UPDATE_ACTION_ROLLBACK


def u(action: events_pb2.UpdateAction, version: str = "", *, tenant: str = "", fraction: float = 0.0,
      previous: str = "") -> events_pb2.ModelUpdate:
    return events_pb2.ModelUpdate(model="m", action=action, version=version, tenant=tenant,
                                  canary_fraction=fraction, previous_version=previous)


def test_promote_records_what_was_served_before_once() -> None:
    s = apply_order(Slot(), u(P, "v1", previous=BASE))
    assert (s.promoted, s.history) == ("v1", (BASE,))
    s = apply_order(s, u(P, "v2"))                           # no previous_version: the slot's own
    assert s.history == (BASE, "v1")
    assert apply_order(s, u(P, "v2")).history == (BASE, "v1")   # re-sent order: unchanged
    assert apply_order(Slot(history=("v1",)), u(P, "v3", previous="v1")).history == ("v1",)  # no repeat


def test_canary_is_clamped_and_graduates_on_promote() -> None:
    s = apply_order(Slot(promoted="v1"), u(C, "v2", fraction=3.0))
    assert (s.canary, s.canary_fraction) == ("v2", 1.0)
    assert apply_order(s, u(C, "v2", fraction=-1.0)).canary == ""
    s = apply_order(s, u(P, "v2"))
    assert (s.promoted, s.canary, s.canary_fraction) == ("v2", "", 0.0)
    other = apply_order(apply_order(Slot(promoted="v1"), u(C, "v2", fraction=0.5)), u(P, "v3"))
    assert other.canary == "v2"                              # another version's canary keeps running


def test_rollback_targets_and_history() -> None:
    s = Slot(promoted="v4", history=(BASE, "v1", "v2", "v1", "v3"), canary="v5", canary_fraction=0.2)
    named = apply_order(s, u(R, "v1"))                       # from the last occurrence on
    assert (named.promoted, named.history, named.canary) == ("v1", (BASE, "v1", "v2"), "")
    assert apply_order(s, u(R)).promoted == "v3"             # no version: the newest history entry
    assert apply_order(s, u(R, previous="v2")).promoted == "v2"
    assert apply_order(Slot(), u(R)).promoted == BASE        # the operator slot falls back to the base
    assert apply_order(Slot(), u(R, tenant="acme")).empty    # a tenant slot to nothing: it follows the operator


def test_invalid_orders() -> None:
    for bad, why in ((u(P), "PROMOTE without a version"), (u(C, fraction=0.5), "CANARY without a version"),
                     (u(P, "../x"), "not a version name"), (u(R, previous="a/b"), "not a version name"),
                     (u(events_pb2.UPDATE_ACTION_UNSPECIFIED, "v1"), "unknown action")):
        with pytest.raises(InvalidOrder, match=why):
            apply_order(Slot(), bad)


def test_promoted_for_falls_back_to_the_operator_slot_then_the_base() -> None:
    assert promoted_for({}, "acme") == BASE
    assert promoted_for({"": Slot(promoted="v1"), "acme": Slot(canary="t1", canary_fraction=0.5)}, "acme") == "v1"
    assert promoted_for({"": Slot(promoted="v1"), "acme": Slot(promoted="t2")}, "acme") == "t2"
