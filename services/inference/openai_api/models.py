"""The routing table --> the models a caller may name (`GET /v1/models`), and a request's `model` --> a route.

As vLLM lists a base model and its LoRA modules, the list holds the served model (its name follows the
routing table: promotion, canaries, tenant versions), then every version this pod serves that the caller
may use: `base`, the operator slot's promoted and canary versions, and the versions of the caller's
tenant slot (a backend key never sees another tenant's adapters; operators and services see them all).

A request naming the served model (or nothing) is routed as a gRPC one is. A request naming a version is
served by that version (as a LoRA module is in vLLM), if the request's tenant may use it; anything else
is 404 `model_not_found`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.inference.openai_api.errors import ModelNotFound
from services.inference.routing import RoutingTable
from shared.contracts.orders import BASE, OPERATOR
from shared.security.identity import Identity, Role

OWNER = "apprentice"


@dataclass(frozen=True)
class Listed:
    id: str
    owned_by: str
    version: str | None = None     # None: the served model, routed per request
    canary: bool = False
    tenant: str = ""               # the slot a tenant version belongs to

    def card(self, served_model: str, created: int) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.id, "object": "model", "created": created, "owned_by": self.owned_by,
                                "root": self.version or served_model,
                                "parent": served_model if self.version is not None else None}
        return card


def routable(table: RoutingTable, tenant: str | None) -> list[Listed]:
    """Versions a request of `tenant` may name (None: every slot's, for callers of any tenant)."""
    out: dict[str, Listed] = {BASE: Listed(BASE, OWNER, BASE)}
    for slot, s in sorted(table.slots.items()):
        if slot != OPERATOR and tenant is not None and slot != tenant:
            continue
        owner = slot or OWNER
        if s.promoted:
            out[s.promoted] = Listed(s.promoted, owner, s.promoted, tenant=slot)
        if s.canary and s.canary not in out:
            out[s.canary] = Listed(s.canary, owner, s.canary, canary=True, tenant=slot)
    return list(out.values())


def listing(table: RoutingTable, served_model: str, identity: Identity | None) -> list[Listed]:
    tenant = identity.tenant if identity is not None and identity.role is Role.BACKEND else None
    return [Listed(served_model, OWNER), *(v for v in routable(table, tenant) if v.id != served_model)]


def resolve(table: RoutingTable, served_model: str, name: str, tenant: str) -> tuple[str, bool] | None:
    """The (version, canary) pin for a request of `tenant` naming `name`; None = route as usual."""
    if not name or name == served_model:
        return None
    for v in routable(table, tenant):
        if v.id == name and v.version is not None:
            return v.version, v.canary
    raise ModelNotFound(f"the model {name[:120]!r} does not exist or this caller may not use it; "
                        f"GET /v1/models lists the served model {served_model!r} and its versions")
