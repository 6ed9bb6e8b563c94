"""Which roles may call which RPC: the one table every server's interceptor enforces.

Methods not listed here are refused (deny by default), except the public ones: gRPC health checks (load
balancers and probes call them without credentials) and reflection (it only describes the public protos).
Per-tenant rules (a backend key only for its own tenant) and argument-dependent rules (`force=true` needs
an operator) are checked by the handlers, from the caller's `Identity` (shared/security/identity.py).
"""

from __future__ import annotations

from shared.security.identity import Role

B, OP, S = Role.BACKEND, Role.OPERATOR, Role.SERVICE

PUBLIC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                   "/grpc.reflection.v1.ServerReflection/")

METHOD_ROLES: dict[str, frozenset[Role]] = {
    # inference: product backends; services (judge, extractor, evaluation) and operators for any tenant
    "/apprentice.v1.Inference/Generate": frozenset({B, OP, S}),
    "/apprentice.v1.Inference/GenerateStream": frozenset({B, OP, S}),
    "/apprentice.v1.Feedback/Submit": frozenset({B, OP, S}),
    # knowledge: reads filtered to the caller's tenant by the handler; review is the operator's
    "/apprentice.v1.Knowledge/List": frozenset({B, OP, S}),
    "/apprentice.v1.Knowledge/Get": frozenset({B, OP, S}),
    "/apprentice.v1.Knowledge/Approve": frozenset({OP}),
    "/apprentice.v1.Knowledge/Reject": frozenset({OP}),
    "/apprentice.v1.Knowledge/Pin": frozenset({OP}),
    "/apprentice.v1.Knowledge/Edit": frozenset({OP}),
    "/apprentice.v1.Knowledge/Restore": frozenset({OP}),
    "/apprentice.v1.Knowledge/Retire": frozenset({OP}),
    "/apprentice.v1.Knowledge/Split": frozenset({OP}),
    # weights: the trainer uploads, pods download and report; promotion orders are the operator's
    # (a service may Promote only through the eval gate: `force` is checked in the handler)
    "/apprentice.v1.Weights/Upload": frozenset({OP, S}),
    "/apprentice.v1.Weights/Download": frozenset({OP, S}),
    "/apprentice.v1.Weights/List": frozenset({OP, S}),
    "/apprentice.v1.Weights/Get": frozenset({OP, S}),
    "/apprentice.v1.Weights/Status": frozenset({OP, S}),
    "/apprentice.v1.Weights/Promote": frozenset({OP, S}),
    "/apprentice.v1.Weights/Canary": frozenset({OP}),
    "/apprentice.v1.Weights/Rollback": frozenset({OP}),
    "/apprentice.v1.Weights/Pin": frozenset({OP}),
    "/apprentice.v1.Weights/Heartbeat": frozenset({S}),
}


def is_public(method: str) -> bool:
    return method.startswith(PUBLIC_PREFIXES)


def allowed_roles(method: str) -> frozenset[Role]:
    """The roles that may call `method` (full name `/package.Service/Method`); empty = nobody."""
    return METHOD_ROLES.get(method, frozenset())
