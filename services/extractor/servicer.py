"""gRPC `apprentice.v1.Knowledge` --> the knowledge store: list, read (any kept version, or the training
view), and the operator's approve / reject / pin / edit.

Tenancy of reads (List, Get), by the caller's identity (set by the auth interceptor):
- a backend key reads only its own tenant's bases; naming another tenant is PERMISSION_DENIED;
- an operator reads the tenant it names (`ListKnowledgeRequest.tenant` or `x-apprentice-tenant`
  metadata), or every tenant when it names none;
- a service credential, and any caller of a server without keys (ANONYMOUS, loopback only), must name
  the tenant: List without one returns nothing, Get without one is PERMISSION_DENIED. Knowledge reads
  without a tenant identity return nothing.
Changes (approve / reject / pin / edit) are operator-only (the interceptor's policy); with
`x-apprentice-tenant` metadata they are limited to that tenant. The caller is recorded on the item.
"""

from __future__ import annotations

from typing import Any

import grpc

from services.extractor.curation import TRAINING
from services.extractor.knowledge import KnowledgeStore, training_view
from services.extractor.trajectories import split_key
from shared.audit import AuditLog
from shared.proto.apprentice.v1 import events_pb2, knowledge_pb2, knowledge_pb2_grpc
from shared.rpc.grpc_util import (
    LIST_SCOPE_METADATA,
    TENANT_METADATA,
    NotFound,
    PermissionDenied,
    create_server,
    grpc_errors,
    metadata_value,
    require,
)
from shared.security.identity import ANONYMOUS, Identity, Role, current_identity
from shared.settings import CommonSettings

SERVICE = "apprentice.v1.Knowledge"
S = events_pb2.ItemStatus
MAX_TEXT = 4000
MAX_ITEM_ID = 64
"""Item ids are 12 hex digits (curation.item_id); a longer one names nothing and would only bloat the audit
record that is written before the lookup."""


def summary(snap: events_pb2.KnowledgeSnapshot) -> knowledge_pb2.KnowledgeSummary:
    def count(*st: int) -> int:
        return sum(1 for it in snap.items if it.status in st)

    return knowledge_pb2.KnowledgeSummary(
        key=snap.key, version=snap.version, item_count=len(snap.items),
        approved_count=count(S.ITEM_STATUS_APPROVED), proposed_count=count(S.ITEM_STATUS_PROPOSED),
        pinned_count=count(S.ITEM_STATUS_PINNED), rejected_count=count(S.ITEM_STATUS_REJECTED),
        require_approval=snap.require_approval, training_count=count(*TRAINING))


def _check_key(key: str) -> None:
    require(bool(key), "key is required (\"tenant/domain\")")
    require(len(key) <= 512 and "/" in key, f"key must look like \"tenant/domain\", got {key!r}")


class KnowledgeServicer(knowledge_pb2_grpc.KnowledgeServicer):
    def __init__(self, store: KnowledgeStore, audit: AuditLog | None = None) -> None:
        """`audit`: where every review action is recorded before it takes effect (None only in tests
        that exercise the store without a broker)."""
        self.store = store
        self.audit = audit

    def _visible(self, key: str, context: Any) -> None:
        tenant = metadata_value(context, TENANT_METADATA)
        if tenant and split_key(key)[0] != tenant:
            raise PermissionDenied(f"tenant {tenant!r} may not access {key!r}")

    @staticmethod
    def _caller() -> Identity:
        return current_identity() or ANONYMOUS

    def _read_scope(self, context: Any, requested: str = "") -> str | None:
        """The tenant whose bases the caller may read: a name, "" = every tenant, None = nothing."""
        header = metadata_value(context, TENANT_METADATA)
        if requested and header and requested != header:
            raise PermissionDenied(f"request names tenant {requested!r} but x-apprentice-tenant says {header!r}")
        named = requested or header
        who = self._caller()
        if who.role is Role.BACKEND:
            if named and named != who.tenant:
                raise PermissionDenied(f"backend key {who.key_id!r} reads tenant {who.tenant!r} only, not {named!r}")
            return who.tenant
        if named:
            return named
        return "" if who.role is Role.OPERATOR else None

    @grpc_errors
    def List(self, request: knowledge_pb2.ListKnowledgeRequest, context: Any) -> knowledge_pb2.ListKnowledgeResponse:
        require(len(request.tenant) <= 128, "tenant must be at most 128 characters")
        tenant = self._read_scope(context, request.tenant)
        context.set_trailing_metadata(((LIST_SCOPE_METADATA, "none" if tenant is None else "tenant" if tenant
                                        else "all"),))
        out = knowledge_pb2.ListKnowledgeResponse()
        if tenant is None:
            return out       # no tenant identity, none named: nothing
        for key in self.store.base_keys():
            if tenant and split_key(key)[0] != tenant:
                continue
            snap = self.store.latest(key)
            if snap is not None:
                out.bases.append(summary(snap))
        return out

    @grpc_errors
    def Get(self, request: knowledge_pb2.GetKnowledgeRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        _check_key(request.key)
        require(request.version >= 0, f"version must be >= 0 (0 = latest), got {request.version}")
        tenant = self._read_scope(context)
        if tenant is None:
            raise PermissionDenied(f"{self._caller().role.value} callers must name the tenant they read: send "
                                   f"`x-apprentice-tenant: {split_key(request.key)[0]}` metadata")
        if tenant and split_key(request.key)[0] != tenant:
            raise PermissionDenied(f"tenant {tenant!r} may not read {request.key!r}")
        snap = self.store.get(request.key, int(request.version))
        return training_view(snap) if request.training_view else snap

    def _act(self, request: Any, context: Any, action: str, text: str = "") -> events_pb2.KnowledgeSnapshot:
        _check_key(request.key)
        require(bool(request.item_id), "item_id is required")
        require(len(request.item_id) <= MAX_ITEM_ID, f"item_id must be at most {MAX_ITEM_ID} characters "
                                                     f"(got {len(request.item_id)})")
        require(len(request.operator) <= 200, "operator must be at most 200 characters")
        target = f"{request.key}#{request.item_id}"
        try:
            self._visible(request.key, context)
        except PermissionDenied as e:
            if self.audit is not None:
                self.audit.record(f"knowledge.{action}", target, tenant=split_key(request.key)[0], allowed=False,
                                  reason=str(e))
            raise
        override = bool(getattr(request, "override_screen", False))
        if self.audit is not None:
            self.audit.record(f"knowledge.{action}", target, tenant=split_key(request.key)[0],
                              details={"override_screen": str(override).lower(), "operator": request.operator,
                                       **({"text": text[:500]} if text else {})})
        return self.store.act(request.key, request.item_id, action, request.operator, text,
                              by=self._caller().to_principal(),
                              override_screen=override)

    @grpc_errors
    def Approve(self, request: knowledge_pb2.ItemActionRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        return self._act(request, context, "approve")

    @grpc_errors
    def Reject(self, request: knowledge_pb2.ItemActionRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        return self._act(request, context, "reject")

    @grpc_errors
    def Pin(self, request: knowledge_pb2.ItemActionRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        return self._act(request, context, "pin")

    @grpc_errors
    def Edit(self, request: knowledge_pb2.EditItemRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        require(bool(request.text.strip()), "text is required")
        require(len(request.text) <= MAX_TEXT, f"text must be at most {MAX_TEXT} characters")
        return self._act(request, context, "edit", request.text)

    @grpc_errors
    def Restore(self, request: knowledge_pb2.ItemActionRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        return self._act(request, context, "restore")

    @grpc_errors
    def Retire(self, request: knowledge_pb2.ItemActionRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        return self._act(request, context, "retire")

    @grpc_errors
    def Split(self, request: knowledge_pb2.EditItemRequest, context: Any) -> events_pb2.KnowledgeSnapshot:
        require(bool(request.text.strip()), "text is required: the merged text to split off")
        require(len(request.text) <= MAX_TEXT, f"text must be at most {MAX_TEXT} characters")
        return self._act(request, context, "split", request.text)


def create_knowledge_server(store: KnowledgeStore, port: int, host: str = "",
                            common: CommonSettings | None = None,
                            audit: AuditLog | None = None) -> tuple[grpc.Server, int, Any]:
    """(server, bound port, health servicer); not started. Port 0 picks a free port."""
    servicer = KnowledgeServicer(store, audit)

    def register(server: grpc.Server) -> None:
        knowledge_pb2_grpc.add_KnowledgeServicer_to_server(servicer, server)

    return create_server(port, register, [SERVICE], host=host, common=common)


__all__ = ["SERVICE", "KnowledgeServicer", "NotFound", "create_knowledge_server", "summary"]
