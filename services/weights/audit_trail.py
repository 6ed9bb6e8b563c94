"""Weights actions (promote, force, canary, rollback, pin, gate verdicts) --> audit records, before they act.

The records go to `apprentice.audit.v1` through `shared.audit.AuditLog` (the sink), keyed by
`<model>/<version>`, with the caller's identity (the gRPC call's, or `SELF` for the service's own
decisions: the promotion policy after the eval gate, canary reviews). An allowed action is recorded
first and applied only once its record is durable: when the record cannot be written the action fails
with UNAVAILABLE and nothing changed. A refused attempt is recorded too (allowed=false); if that record
cannot be written the refusal still stands (logged), since nothing was going to change anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from shared.rpc.grpc_util import ServiceError, Unavailable
from shared.security.identity import Identity, Role

log = logging.getLogger(__name__)

PROMOTE = "weights.promote"
CANARY = "weights.canary"
ROLLBACK = "weights.rollback"
PIN = "weights.pin"
UNPIN = "weights.unpin"
GATE = "weights.gate"

SELF = Identity(key_id="weights", role=Role.SERVICE)
"""Who the service's own decisions are recorded as (policy promotions, canary reviews, gate verdicts)."""


class AuditSink(Protocol):
    """`shared.audit.AuditLog.record`: write one record, durable on return, raise when it is not."""

    def __call__(self, action: str, target: str, *, tenant: str = "", allowed: bool = True, reason: str = "",
                 details: Mapping[str, str] | None = None, identity: Identity | None = None) -> object: ...


def target_of(model: str, version: str) -> str:
    return f"{model}/{version}"


class Trail:
    """The weights service's use of the audit log; without a sink (unit tests of other parts) it records nothing."""

    def __init__(self, sink: AuditSink | None = None) -> None:
        self.sink = sink

    def allowed(self, action: str, model: str, version: str, *, tenant: str = "", reason: str = "",
                details: Mapping[str, str] | None = None) -> None:
        """Record an action about to take effect; raise Unavailable when the record is not durable."""
        if self.sink is None:
            return
        try:
            self.sink(action, target_of(model, version), tenant=tenant, allowed=True, reason=reason,
                      details=details)
        except ServiceError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure to write means: do not act
            raise Unavailable(f"audit record for {action} {target_of(model, version)} not written "
                              f"({type(e).__name__}: {e}); nothing was changed, retry") from e

    def refused(self, action: str, model: str, version: str, *, tenant: str = "", reason: str = "",
                details: Mapping[str, str] | None = None) -> None:
        """Record a refused attempt; a failure to write is logged, never raised (the refusal stands)."""
        self.outcome(action, model, version, allowed=False, tenant=tenant, reason=reason, details=details)

    def outcome(self, action: str, model: str, version: str, *, allowed: bool, tenant: str = "", reason: str = "",
                details: Mapping[str, str] | None = None) -> None:
        """Record something that has already been decided (a refusal, an eval-gate verdict); best effort:
        a failure to write is logged, never raised."""
        if self.sink is None:
            return
        try:
            self.sink(action, target_of(model, version), tenant=tenant, allowed=allowed, reason=reason,
                      details=details)
        except Exception:  # noqa: BLE001
            log.exception("audit record of %s on %s (allowed=%s) not written", action, target_of(model, version),
                          allowed)
