"""CheckpointPublished --> an evaluated candidate --> the configured promotion policy's order (if any).

Idempotent by the event's id (recorded in the model state once the whole effect is done), and by the
manifest status (a version is evaluated once; a redelivered event finds it APPROVED and only re-applies
the policy). A candidate older than what its tenant already serves is evaluated but never auto-promoted.
"""

from __future__ import annotations

import logging

from services.weights import audit_trail
from services.weights.evaluator import Evaluator
from services.weights.manifests import version_order_key
from services.weights.orders import OrderDesk
from services.weights.settings import WeightsSettings
from services.weights.store import WeightStore
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import events_pb2, weights_pb2

log = logging.getLogger(__name__)


class PromotionPolicy:
    def __init__(self, store: WeightStore, desk: OrderDesk, evaluator: Evaluator | None,
                 settings: WeightsSettings) -> None:
        self.store = store
        self.desk = desk
        self.evaluator = evaluator
        self.settings = settings

    def on_checkpoint(self, ev: events_pb2.CheckpointPublished) -> str:
        """Handle one event; returns what happened, in words. NotFound when the version is not stored."""
        event_id = ev.envelope.event_id
        if event_id in self.store.state(ev.model).handled_events:
            return "duplicate event"
        m = self.store.get(ev.model, ev.version)
        outcome = "recorded"
        if m.status == weights_pb2.VERSION_STATUS_CANDIDATE and self.evaluator is not None \
                and self.settings.evaluate_checkpoints:
            m = self.evaluator.evaluate(m, extra_metrics=dict(ev.metrics))
            outcome = "approved" if m.status == weights_pb2.VERSION_STATUS_APPROVED else "rejected"
            self.desk.audit.outcome(audit_trail.GATE, m.model, m.version, allowed=outcome == "approved",
                                    tenant=m.tenant, reason=m.status_reason, details={"event_id": event_id})
        if m.status == weights_pb2.VERSION_STATUS_APPROVED:
            outcome = self._apply_policy(m, event_id)
        with self.store.transaction():
            state = self.store.state(ev.model)
            state.note_handled(event_id)
            self.store.save_state(state)
        log.info("checkpoint handled", extra={"model": m.model, "version": m.version, "outcome": outcome,
                                              "status_reason": m.status_reason})
        return outcome

    def _apply_policy(self, m: weights_pb2.Manifest, event_id: str) -> str:
        policy = self.settings.policy
        if policy == "manual":
            return "approved; waiting for an operator (policy manual)"
        serving = self.store.state(m.model).serving_for(m.tenant)
        if serving != BASE:
            current = self.store.get(m.model, serving)
            if version_order_key(current) > version_order_key(m):
                return f"approved; {serving} is newer and already served, not auto-promoted"
        reason = f"policy {policy} after the eval gate (checkpoint event {event_id})"
        if policy == "auto":
            self.desk.promote(m.model, m.version, reason=reason)
            return "promoted"
        self.desk.canary(m.model, m.version, self.settings.canary_fraction, reason=reason)
        return f"canary at {self.settings.canary_fraction:.0%}"
