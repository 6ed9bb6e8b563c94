"""Pod heartbeats + promotion state --> per-pod convergence, lagging flags and canary health.

A pod *converges* when, for every tenant slot with a promoted version, it serves that version to the
slot's requests, and it canaries exactly the ordered canaries. A pod is *lagging* when it has not
converged for longer than the order deadline (counted from the later of the last order and the moment
it was first seen off target), or when it went silent: the failure the issue asks to make loud.

How a heartbeat is read (the contract with inference pods, see PodHeartbeat in weights.proto):
- version served to tenant t = tenant_versions[t], else tenant_versions[""], else serving_version;
- canary of tenant t = tenant_canaries[t] when the pod fills tenant_canaries, else canary_version;
- canary health: canary_requests / canary_errors count requests on canary_version since it was installed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from services.weights.manifests import BASE, ModelState
from shared.proto.apprentice.v1 import weights_pb2


@dataclass
class Expected:
    """What every pod of a model should serve now."""

    promoted: dict[str, str]   # tenant slot -> version ("" always present)
    canaries: dict[str, str]   # tenant slot -> canary version (active canaries only)


def expected_of(state: ModelState) -> Expected:
    promoted = {t: s.promoted for t, s in state.slots.items() if s.promoted}
    promoted.setdefault("", BASE)
    canaries = {t: s.canary for t, s in state.slots.items() if s.canary}
    return Expected(promoted, canaries)


def served_version(hb: weights_pb2.PodHeartbeat, tenant: str) -> str:
    if tenant in hb.tenant_versions:
        return hb.tenant_versions[tenant]
    if "" in hb.tenant_versions:
        return hb.tenant_versions[""]
    return hb.serving_version


def canary_version(hb: weights_pb2.PodHeartbeat, tenant: str) -> str:
    if hb.tenant_canaries:
        return hb.tenant_canaries.get(tenant, "")
    return hb.canary_version


def mismatches(hb: weights_pb2.PodHeartbeat, expected: Expected) -> list[str]:
    """Why `hb` does not match `expected`, in words; empty when it converged."""
    out = []
    for tenant, version in sorted(expected.promoted.items()):
        got = served_version(hb, tenant)
        if got != version:
            out.append(f"tenant {tenant or '*'!r} serves {got or '?'!r}, ordered {version!r}")
    slots = set(expected.canaries) | (set(hb.tenant_canaries) if hb.tenant_canaries else set())
    if not hb.tenant_canaries and hb.canary_version and not expected.canaries:
        out.append(f"canaries {hb.canary_version!r}, no canary ordered")
    for tenant in sorted(slots):
        want, got = expected.canaries.get(tenant, ""), canary_version(hb, tenant)
        if want != got:
            out.append(f"tenant {tenant or '*'!r} canary {got or 'none'!r}, ordered {want or 'none'!r}")
    return out


@dataclass
class _Pod:
    heartbeat: weights_pb2.PodHeartbeat
    received_at: float
    off_target_since: float | None


class PodRegistry:
    """Latest heartbeat per (model, pod), in memory: pods beat every few seconds, so a restart of the
    weights service recovers the picture within one heartbeat interval."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._lock = threading.Lock()

    def record(self, hb: weights_pb2.PodHeartbeat, state: ModelState, now: float | None = None) -> bool:
        """Store a heartbeat; returns whether the pod matches `state`."""
        now = time.time() if now is None else now
        converged = not mismatches(hb, expected_of(state))
        with self._lock:
            prev = self._pods.get((hb.model, hb.pod_id))
            since = None if converged else (prev.off_target_since if prev and prev.off_target_since else now)
            self._pods[(hb.model, hb.pod_id)] = _Pod(hb, now, since)
        return converged

    def pods(self, model: str, forget_s: float, now: float | None = None) -> list[tuple[weights_pb2.PodHeartbeat,
                                                                                          float, float | None]]:
        now = time.time() if now is None else now
        with self._lock:
            for key in [k for k, p in self._pods.items() if now - p.received_at > forget_s]:
                del self._pods[key]
            return [(p.heartbeat, p.received_at, p.off_target_since)
                    for (m, _), p in sorted(self._pods.items()) if m == model]

    def status(self, state: ModelState, *, order_deadline_s: float, heartbeat_timeout_s: float, forget_s: float,
               now: float | None = None) -> weights_pb2.StatusResponse:
        now = time.time() if now is None else now
        expected = expected_of(state)
        default = state.slots.get("")
        resp = weights_pb2.StatusResponse(
            model=state.model, promoted_version=expected.promoted[""],
            canary_version=default.canary if default else "",
            canary_fraction=default.canary_fraction if default and default.canary else 0.0,
            last_order_id=state.last_order_id)
        resp.tenant_versions.update(expected.promoted)
        resp.tenant_canaries.update(expected.canaries)
        if state.last_order_at:
            resp.last_order_at.FromNanoseconds(int(state.last_order_at * 1e9))
        for hb, received_at, off_since in self.pods(state.model, forget_s, now):
            age = now - received_at
            problems = mismatches(hb, expected)
            if age > heartbeat_timeout_s:
                problems.insert(0, f"no heartbeat for {age:.0f}s")
            converged = not problems
            since = max(off_since if off_since is not None else received_at, state.last_order_at)
            lagging = not converged and now - since > order_deadline_s
            ps = weights_pb2.PodStatus(
                pod_id=hb.pod_id, serving_version=served_version(hb, ""), canary_version=hb.canary_version,
                converged=converged, lagging=lagging, last_error=hb.last_error, endpoint=hb.endpoint,
                canary_requests=hb.canary_requests, canary_errors=hb.canary_errors, heartbeat_age_s=age,
                detail=("lagging: " if lagging else "") + "; ".join(problems))
            ps.last_heartbeat.FromNanoseconds(int(received_at * 1e9))
            ps.tenant_versions.update(hb.tenant_versions)
            ps.tenant_canaries.update(hb.tenant_canaries)
            resp.pods.append(ps)
        resp.lagging_pods = sum(p.lagging for p in resp.pods)
        resp.converged = bool(resp.pods) and all(p.converged for p in resp.pods)
        return resp

    def canary_health(self, model: str, version: str, *, heartbeat_timeout_s: float,
                      now: float | None = None) -> tuple[int, int, str]:
        """(healthy requests, failed requests, first error) on canary `version` over live pods. Requests
        of a pod count as healthy only while it reports no canary errors and no last_error."""
        now = time.time() if now is None else now
        healthy = failed = 0
        error = ""
        for hb, received_at, _ in self.pods(model, forget_s=float("inf"), now=now):
            canaries = set(hb.tenant_canaries.values()) | ({hb.canary_version} if hb.canary_version else set())
            if version not in canaries or now - received_at > heartbeat_timeout_s:
                continue
            if hb.canary_errors > 0:
                failed += hb.canary_errors
                error = error or f"pod {hb.pod_id}: {hb.canary_errors} failed requests ({hb.last_error or 'no detail'})"
            elif not hb.last_error:
                healthy += hb.canary_requests
        return healthy, failed, error
