"""An authenticated caller --> what it may act on.

Three kinds of callers (docs/architecture.md §6):
- backend keys act for exactly one tenant: Generate, Feedback, and reading that tenant's knowledge;
- operator keys: promotion, rollback, canary, pins, knowledge review, any tenant;
- service credentials: inference pods, trainer, grader, extractor calling each other.
A server started without any keys (loopback only) treats every caller as ANONYMOUS, which may do
everything a local developer may do but never reads data without naming a tenant.

The identity of the call being handled travels in a context variable set by the interceptor, so handlers
and the modules they call (audit, knowledge review) read it without threading it through every signature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum

from shared.proto.apprentice.v1 import common_pb2


class Role(StrEnum):
    BACKEND = "backend"
    OPERATOR = "operator"
    SERVICE = "service"
    METRICS = "metrics"     # a scraper's key: the full /metrics exposition and nothing else (no RPC, no HTTP API)
    ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Identity:
    key_id: str
    """Names the credential (never the secret); two keys of one caller during a rotation share it."""
    role: Role
    tenant: str = ""
    """The one tenant a backend key acts for; empty for operators and services (any tenant)."""

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR

    @property
    def is_anonymous(self) -> bool:
        return self.role is Role.ANONYMOUS

    def to_principal(self) -> common_pb2.Principal:
        return common_pb2.Principal(key_id=self.key_id, role=self.role.value, tenant=self.tenant)


ANONYMOUS = Identity(key_id="anonymous", role=Role.ANONYMOUS)

_current: ContextVar[Identity | None] = ContextVar("apprentice_identity", default=None)


def current_identity() -> Identity | None:
    """The caller of the gRPC call being handled on this thread (None outside a call)."""
    return _current.get()


@contextlib.contextmanager
def acting_as(identity: Identity | None) -> Iterator[None]:
    """Run a block as `identity` (the interceptor's wrapper; internal jobs that act as the service)."""
    token = _current.set(identity)
    try:
        yield
    finally:
        _current.reset(token)
