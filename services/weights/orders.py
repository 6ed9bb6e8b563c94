"""Promote / canary / rollback requests + promotion state --> durable `ModelUpdate` orders + new state.

Every order is published (and confirmed durable by the broker) *before* the state that describes it is
saved, under the store lock: the state never claims an order that pods could not have received. Pods
that miss an order catch up from `HeartbeatAck.desired` (see `desired`).

Tenant slots: a version belongs to the tenant whose data trained it (`Manifest.tenant`), so promoting it
changes that tenant's slot only; `""` is the operator slot every other tenant follows.
What an order does to a slot is shared/contracts/orders.py `apply_order`, the rules every inference pod applies
to its routing table too: the desk's new state is the order it sends, applied to the slot (computed
before the order is sent, saved after it is durable). This module decides which orders to issue.

Each order is recorded on the audit topic (audit_trail.py) before it is published; a refused promote
or canary (gate, rolled back, integrity) is recorded as refused. `force` overrides the eval gate's
verdict, except its integrity check: a version with NaN/Inf weights is never served (gate.integrity_of).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from services.weights import audit_trail
from services.weights.audit_trail import Trail
from services.weights.gate import integrity_of
from services.weights.manifests import ModelState
from services.weights.pods import PodRegistry
from services.weights.store import WeightStore
from shared.contracts.events import deterministic_id, make_envelope
from shared.contracts.orders import BASE, apply_order
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.rpc.grpc_util import FailedPrecondition, require

log = logging.getLogger(__name__)

Publisher = Callable[[events_pb2.ModelUpdate], None]
"""Send one order; return only once it is durable, raise otherwise (the state is then left unchanged)."""
Gate = Callable[[weights_pb2.Manifest], weights_pb2.Manifest]
"""Evaluate a CANDIDATE; return its manifest with eval results and status APPROVED or REJECTED."""
IntegrityCheck = Callable[[weights_pb2.Manifest], weights_pb2.Manifest]
"""Run only the gate's integrity check on a version not yet checked; return the manifest with its result."""

S = weights_pb2
ACTION_NAMES: dict[int, str] = {events_pb2.UPDATE_ACTION_PROMOTE: "promote", events_pb2.UPDATE_ACTION_CANARY: "canary",
                events_pb2.UPDATE_ACTION_ROLLBACK: "rollback"}


class OrderDesk:
    def __init__(self, store: WeightStore, publish: Publisher, *, source: str = "weights",
                 weights_endpoint: str = "", gate: Gate | None = None, integrity: IntegrityCheck | None = None,
                 audit: Trail | None = None) -> None:
        self.store = store
        self.publish = publish
        self.source = source
        self.weights_endpoint = weights_endpoint
        self.gate = gate
        self.integrity = integrity
        self.audit = audit or Trail()

    # --- the three orders ------------------------------------------------------------------------------
    def promote(self, model: str, version: str, *, force: bool = False, reason: str = "") -> weights_pb2.OrderAck:
        require(version != BASE, "the base model is served by rolling back to it: `rollback --version base`")
        self._admit(self.store.get(model, version), force, "promote")
        with self.store.transaction():
            m = self.store.get(model, version)
            state = self.store.state(model)
            previous = state.serving_for(m.tenant)
            self._recheck_integrity(m, "promote")  # it may have been checked since _admit, outside the lock
            self.audit.allowed(audit_trail.PROMOTE, model, version, tenant=m.tenant, reason=reason, details={
                "force": str(force).lower(), "previous": previous, "slot": m.tenant or "*",
                "status": S.VersionStatus.Name(m.status)})
            # history gains `previous`; a canary of this version graduated, another version's keeps running
            update = self._send(state, events_pb2.UPDATE_ACTION_PROMOTE, m, previous, reason)
            self.store.save_state(state)
            self._restatus(state, [version, previous],
                           f"promoted{' (forced)' if force else ''}: {reason}" if reason else "")
        return self._ack(update)

    def canary(self, model: str, version: str, fraction: float, *, reason: str = "") -> weights_pb2.OrderAck:
        require(version != BASE, "the base model cannot be a canary")
        require(0 < fraction <= 1, f"canary fraction must be in (0, 1] (got {fraction})")
        self._admit(self.store.get(model, version), False, "canary")
        with self.store.transaction():
            m = self.store.get(model, version)
            state = self.store.state(model)
            slot = state.slot(m.tenant)
            current = state.serving_for(m.tenant)
            if current == version:
                raise FailedPrecondition(f"{model} {version} is already promoted for tenant {m.tenant or '*'!r}")
            self._recheck_integrity(m, "canary")
            self.audit.allowed(audit_trail.CANARY, model, version, tenant=m.tenant, reason=reason, details={
                "fraction": f"{fraction:g}", "serving": current, "slot": m.tenant or "*",
                "replaces_canary": slot.canary if slot.canary != version else ""})
            ended_canary = slot.canary if slot.canary != version else ""
            update = self._send(state, events_pb2.UPDATE_ACTION_CANARY, m, current, reason, fraction)
            state.slots[m.tenant] = replace(state.slot(m.tenant), canary_started_at=time.time())
            self.store.save_state(state)
            self._restatus(state, [version, ended_canary], f"canary at {fraction:.0%}: {reason}" if reason else "")
        return self._ack(update)

    def rollback(self, model: str, version: str = "", *, tenant: str | None = None,
                 reason: str = "") -> weights_pb2.OrderAck:
        if version and version != BASE:  # outside the store lock: a first integrity check reads tensors
            self._require_integrity(self.store.get(model, version), "rollback")
        with self.store.transaction():
            state = self.store.state(model)
            if tenant is None:
                tenant = self.store.get(model, version).tenant if version and version != BASE else state.last_order_slot
            slot = state.slot(tenant)
            current = state.serving_for(tenant)
            if version:
                target = version
                if target != BASE:
                    tm = self.store.get(model, target)
                    if tm.tenant != tenant:
                        raise FailedPrecondition(f"{model} {target} belongs to tenant {tm.tenant or '*'!r}, "
                                                 f"not to the slot being rolled back ({tenant or '*'!r})")
                    if tm.status == S.VERSION_STATUS_REJECTED:
                        raise FailedPrecondition(f"{model} {target} was rejected by the eval gate; "
                                                 "promote it with force if you really mean it")
            elif slot.canary:
                target = current  # abort the canary, keep what is promoted
            else:
                target = self._pop_previous(model, state, tenant, current)
            if target == current and not slot.canary:
                raise FailedPrecondition(f"{model}: tenant {tenant or '*'!r} already serves {target!r} "
                                         "and has no canary; nothing to roll back")
            tm = self.store.get(model, target)
            self._recheck_integrity(tm, "rollback")  # a history target may predate the check
            replaced = [v for v in (current, slot.canary) if v and v != target]
            previous = current if current != target else slot.canary
            self.audit.allowed(audit_trail.ROLLBACK, model, target, tenant=tenant, reason=reason, details={
                "previous": previous, "replaced": ",".join(replaced), "slot": tenant or "*",
                "explicit_version": str(bool(version)).lower()})
            # the slot serves `target`, its history from target's last occurrence on goes, its canary ends
            update = self._send(state, events_pb2.UPDATE_ACTION_ROLLBACK, tm, previous, reason, slot_key=tenant)
            self.store.save_state(state)
            self._restatus(state, [target, *replaced], f"rollback: {reason}" if reason else "rolled back",
                           rolled_back=True)
        return self._ack(update)

    # --- canary policy ---------------------------------------------------------------------------------
    def review_canaries(self, model: str, pods: PodRegistry, *, min_requests: int, auto_promote: bool,
                        heartbeat_timeout_s: float, rollback_min_requests: int = 5,
                        max_error_rate: float = 0.1) -> list[weights_pb2.OrderAck]:
        """Abort a canary whose error rate is above `max_error_rate` once `rollback_min_requests` requests
        were served (summed over live pods reported by service credentials: one report of one error is
        not evidence); promote one with `min_requests` healthy requests and an error rate within the limit
        (when `auto_promote`). Healthy = answered by a pod that reports the canary with no errors.
        The defaults are the settings' defaults (settings.py)."""
        acks = []
        for tenant, slot in list(self.store.state(model).slots.items()):
            if not slot.canary:
                continue
            t = pods.canary_tally(model, slot.canary, heartbeat_timeout_s=heartbeat_timeout_s)
            failing = t.requests >= rollback_min_requests and t.errors > max_error_rate * t.requests
            try:
                if failing:
                    why = (f"{t.errors} of {t.requests} requests failed on {t.pods} pods ({t.error_rate:.0%}, limit "
                           f"{max_error_rate:.0%}): {t.first_error}")
                    log.error("canary failed, rolling back", extra={"model": model, "version": slot.canary,
                                                                    "error": why})
                    acks.append(self.rollback(model, tenant=tenant, reason=f"canary {slot.canary} failed: {why}"))
                elif auto_promote and t.healthy >= min_requests and t.error_rate <= max_error_rate:
                    acks.append(self.promote(model, slot.canary,
                                             reason=f"canary healthy after {t.healthy} requests"))
            except FailedPrecondition as e:  # raced with an operator order: theirs wins
                log.warning("canary review skipped: %s", e)
        return acks

    # --- what pods should serve ------------------------------------------------------------------------
    def desired(self, model: str) -> list[events_pb2.ModelUpdate]:
        """The orders that describe the current state, with deterministic event ids (re-sent forever)."""
        state = self.store.state(model)
        out = []
        slots = dict(state.slots)
        slots.setdefault("", state.slot(""))
        for tenant, slot in sorted(slots.items()):
            for action, version, fraction in ((events_pb2.UPDATE_ACTION_PROMOTE, slot.promoted or
                                               (BASE if tenant == "" else ""), 0.0),
                                              (events_pb2.UPDATE_ACTION_CANARY, slot.canary, slot.canary_fraction)):
                if not version:
                    continue
                try:
                    m = self.store.get(model, version)
                except Exception:  # noqa: BLE001 - a version deleted by hand: say nothing rather than fail pods
                    continue
                u = self._order(action, m, tenant, "", "current state", fraction)
                u.envelope.event_id = deterministic_id("desired", model, tenant, ACTION_NAMES[action], version)
                out.append(u)
        return out

    # --- helpers ---------------------------------------------------------------------------------------
    def _admit(self, m: weights_pb2.Manifest, force: bool, action: str) -> weights_pb2.Manifest:
        """The eval gate in front of promote / canary; `force` overrides it (logged), except its integrity
        check. Refusals are audited."""
        if force:
            m = self._require_integrity(m, action)
            if m.status in (S.VERSION_STATUS_REJECTED, S.VERSION_STATUS_CANDIDATE, S.VERSION_STATUS_ROLLED_BACK):
                log.warning("forced past the eval gate", extra={"model": m.model, "version": m.version,
                                                                "status": S.VersionStatus.Name(m.status)})
            return m
        if m.status == S.VERSION_STATUS_CANDIDATE:
            if self.gate is None:
                raise FailedPrecondition(f"{m.model} {m.version} has not been evaluated and no eval gate runs "
                                         "here; use force to skip the gate")
            m = self.gate(m)
        if m.status == S.VERSION_STATUS_REJECTED:
            r = integrity_of(m)
            if r is not None and not r.passed:
                self._refuse_integrity(m, action)
            self._refuse(m, action, f"{m.model} {m.version} was rejected by the eval gate: {m.status_reason}; "
                                    f"use force to {action} it anyway")
        if m.status == S.VERSION_STATUS_ROLLED_BACK:
            self._refuse(m, action, f"{m.model} {m.version} was rolled back ({m.status_reason}); use force to "
                                    f"{action} it again")
        if m.kind == "lora" and m.base_version not in ("", BASE) and not self.store.manifests.exists(
                m.model, m.base_version):
            raise FailedPrecondition(f"{m.model} {m.version} applies to {m.base_version}, which is not stored")
        return m

    def _require_integrity(self, m: weights_pb2.Manifest, action: str) -> weights_pb2.Manifest:
        """Run the integrity check on a version that never had it (when a checker is configured), and refuse
        the action when the version holds NaN/Inf tensors, whatever `force` says."""
        if integrity_of(m) is None and self.integrity is not None and m.version != BASE:
            m = self.integrity(m)
        self._recheck_integrity(m, action)
        return m

    def _recheck_integrity(self, m: weights_pb2.Manifest, action: str) -> None:
        """Under the store lock: refuse when the recorded integrity result failed (no new check here)."""
        r = integrity_of(m)
        if r is not None and not r.passed:
            self._refuse_integrity(m, action)

    def _refuse_integrity(self, m: weights_pb2.Manifest, action: str) -> None:
        r = integrity_of(m)
        self._refuse(m, action, f"{m.model} {m.version} was rejected by the eval gate: it failed the integrity "
                                f"check ({r.detail if r else 'NaN/Inf'}); a model with non-finite weights is never "
                                "served, and force does not override this check")

    def _refuse(self, m: weights_pb2.Manifest, action: str, message: str) -> None:
        self.audit.refused(f"weights.{action}", m.model, m.version, tenant=m.tenant, reason=message,
                           details={"status": S.VersionStatus.Name(m.status)})
        raise FailedPrecondition(message)

    def _pop_previous(self, model: str, state: ModelState, tenant: str, current: str) -> str:
        """The newest history entry that can be served again; it and the entries after it leave the history."""
        history = list(state.slot(tenant).history)
        while history:
            candidate = history.pop()
            if candidate != current and (candidate == BASE or self.store.manifests.exists(model, candidate)):
                state.slots[tenant] = replace(state.slot(tenant), history=tuple(history))
                return candidate
        raise FailedPrecondition(f"{model}: tenant {tenant or '*'!r} has no previous version to roll back to "
                                 f"(serving {current!r}); name one with --version")

    def _order(self, action: events_pb2.UpdateAction, m: weights_pb2.Manifest, slot_key: str, previous: str, reason: str,
               fraction: float = 0.0) -> events_pb2.ModelUpdate:
        # Envelope.tenant must be set; an operator order (slot "") is filed under the default tenant.
        return events_pb2.ModelUpdate(
            envelope=make_envelope(slot_key or "default", source=self.source), model=m.model, action=action,
            version=m.version, canary_fraction=fraction, previous_version=previous, kind=m.kind or "full",
            base_version=m.base_version if m.kind == "lora" else "", reason=reason,
            weights_endpoint=self.weights_endpoint, tenant=slot_key)

    def _send(self, state: ModelState, action: events_pb2.UpdateAction, m: weights_pb2.Manifest, previous: str, reason: str,
              fraction: float = 0.0, *, slot_key: str | None = None) -> events_pb2.ModelUpdate:
        update = self._order(action, m, m.tenant if slot_key is None else slot_key, previous, reason, fraction)
        # The id follows from the order and the state it changes (the last order before it): a replica that
        # died after publishing and before saving leaves that state as it was, so the retry, here or on
        # another replica over the same store, sends the same id again and consumers count one order.
        update.envelope.event_id = deterministic_id("order", m.model, update.tenant, ACTION_NAMES[action], m.version,
                                                    previous, f"{fraction:g}", state.last_order_id)
        new = apply_order(state.slot(update.tenant), update)  # raises InvalidOrder before anything is sent
        self.publish(update)
        state.slots[update.tenant] = new
        state.last_order_id = update.envelope.event_id
        state.last_order_at = time.time()
        state.last_order_slot = update.tenant
        log.info("order sent", extra={"action": ACTION_NAMES[action], "model": m.model, "version": m.version,
                                      "tenant": update.tenant, "previous": previous, "order_id": state.last_order_id})
        return update

    def _restatus(self, state: ModelState, versions: list[str], reason: str, *, rolled_back: bool = False) -> None:
        """Make each version's manifest status agree with the state it is now in (a version no slot serves
        any more is RETIRED, or ROLLED_BACK when a rollback removed it)."""
        promoted = {s.promoted for s in state.slots.values() if s.promoted}
        canaries = {s.canary for s in state.slots.values() if s.canary}
        for v in dict.fromkeys(v for v in versions if v and v != BASE):
            if not self.store.manifests.exists(state.model, v):
                continue

            def change(m: weights_pb2.Manifest) -> None:
                if m.version in promoted:
                    m.status = S.VERSION_STATUS_PROMOTED
                elif m.version in canaries:
                    m.status = S.VERSION_STATUS_CANARY
                elif rolled_back:
                    m.status = S.VERSION_STATUS_ROLLED_BACK
                elif m.status == S.VERSION_STATUS_CANARY:
                    m.status = S.VERSION_STATUS_APPROVED  # a canary replaced by another, never promoted
                elif m.status == S.VERSION_STATUS_PROMOTED:
                    m.status = S.VERSION_STATUS_RETIRED
                if reason and (m.version in promoted or m.version in canaries or rolled_back):
                    m.status_reason = reason

            self.store.update(state.model, v, change)

    @staticmethod
    def _ack(update: events_pb2.ModelUpdate) -> weights_pb2.OrderAck:
        return weights_pb2.OrderAck(order_id=update.envelope.event_id, model=update.model, version=update.version,
                                    action=ACTION_NAMES[update.action])
