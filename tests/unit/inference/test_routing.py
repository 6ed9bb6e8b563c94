"""ModelUpdate orders --> routing table, by hand: promote, canary, rollback, tenant slots, failed loads."""

from __future__ import annotations

import pytest

from services.inference.hotswap import path_slug
from services.inference.routing import RoutingTable
from shared.contracts.orders import BASE, InvalidOrder
from shared.proto.apprentice.v1 import events_pb2

P, C, R = events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_CANARY, events_pb2.UPDATE_ACTION_ROLLBACK


def u(action: events_pb2.UpdateAction, version: str = "", tenant: str = "", fraction: float = 0.0, previous: str = "") -> events_pb2.ModelUpdate:
    return events_pb2.ModelUpdate(model="m", action=action, version=version, tenant=tenant,
                                  canary_fraction=fraction, previous_version=previous)


def test_default_serves_base_to_everyone() -> None:
    t = RoutingTable()
    assert t.choose("acme", 0.0) == (BASE, False)
    assert t.versions() == {BASE}
    assert t.tenant_versions() == {"": BASE}


def test_promote_canary_graduation_and_rollback() -> None:
    t = RoutingTable().apply(u(P, "v1")).apply(u(C, "v2", fraction=0.25))
    assert t.choose("x", 0.10) == ("v2", True)
    assert t.choose("x", 0.25) == ("v1", False)
    assert t.versions() == {"v1", "v2"}
    t = t.apply(u(P, "v2"))                              # the canary graduates
    assert t.tenant_canaries() == {} and t.choose("x", 0.0) == ("v2", False)
    t = t.apply(u(R))                                    # no version: what was served before
    assert t.choose("x", 0.5) == ("v1", False)
    t = t.apply(u(R))
    assert t.choose("x", 0.5) == (BASE, False)


def test_rollback_ends_a_canary_and_canary_zero_fraction_ends_it() -> None:
    t = RoutingTable().apply(u(C, "v2", fraction=1.0))
    assert t.apply(u(C, "v2", fraction=0.0)).tenant_canaries() == {}
    t = t.apply(u(R, "base"))
    assert t.tenant_canaries() == {} and t.choose("x", 0.0) == (BASE, False)


def test_tenant_versions_serve_only_their_tenant() -> None:
    t = RoutingTable().apply(u(P, "v1")).apply(u(P, "t3", tenant="acme")).apply(u(C, "t4", tenant="acme", fraction=0.5))
    assert t.choose("acme", 0.9) == ("t3", False)
    assert t.choose("acme", 0.1) == ("t4", True)
    assert t.choose("globex", 0.1) == ("v1", False)
    assert t.tenant_versions() == {"": "v1", "acme": "t3"}
    assert t.tenant_canaries() == {"acme": ("t4", 0.5)}
    # a tenant rolled back with nothing before: the slot disappears and the tenant inherits the operator's
    t2 = RoutingTable().apply(u(P, "t3", tenant="acme")).apply(u(R, tenant="acme"))
    assert "acme" not in t2.slots and t2.choose("acme", 0.0) == (BASE, False)


def test_operator_canary_does_not_reach_tenants_with_their_own_slot() -> None:
    t = RoutingTable().apply(u(C, "v9", fraction=1.0)).apply(u(P, "t1", tenant="acme"))
    assert t.choose("acme", 0.0) == ("t1", False)
    assert t.choose("other", 0.0) == ("v9", True)


def test_revert_keeps_the_old_version_where_a_load_failed() -> None:
    old = RoutingTable().apply(u(P, "v1"))
    new = old.apply(u(P, "v2")).apply(u(C, "v3", tenant="acme", fraction=0.5))
    kept = new.revert({"v2", "v3"}, old)
    assert kept.choose("x", 0.0) == ("v1", False)
    assert kept.tenant_canaries() == {} and "acme" not in kept.slots


def test_version_names_are_checked_and_paths_made_safe() -> None:
    with pytest.raises(InvalidOrder, match="not a version name"):
        RoutingTable().apply(u(P, "../../etc"))
    with pytest.raises(InvalidOrder, match="without a version"):
        RoutingTable().apply(u(P))
    assert path_slug("/models/Qwen2.5-0.5B") == "_models_Qwen2.5-0.5B"
    assert path_slug("..") == "_" and "/" not in path_slug("org/model")
