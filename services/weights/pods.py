"""Pod heartbeats + promotion state --> per-pod convergence, lagging flags and canary health.

A pod *converges* when, for every tenant slot with a promoted version, it serves that version to the
slot's requests, and it canaries exactly the ordered canaries. A pod is *lagging* when it has not
converged for longer than the order deadline (counted from the later of the last order and the moment
it was first seen off target), or when it went silent: a failure that must be loud (an error log and the lagging-pods gauge), not silent.

How a heartbeat is read (the contract with inference pods, see PodHeartbeat in weights.proto):
- version served to tenant t = tenant_versions[t], else tenant_versions[""], else serving_version;
- canary of tenant t = tenant_canaries[t] when the pod fills tenant_canaries, else canary_version;
- canary health: canary_requests / canary_errors count requests on canary_version since it was installed
  (errors are among the requests).

Who may report: each pod entry belongs to the credential that registered it (another credential beating
under the same pod id is refused), one credential may register `max_pods_per_identity` pods and the
server `max_pods` in all (RESOURCE_EXHAUSTED beyond), and entries silent for `forget_s` expire. Only pods
reported by service credentials (or anonymously, on a server without keys) count towards canary verdicts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from services.weights.manifests import ModelState
from services.weights.pod_share import PodShare, SharedPod
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import PermissionDenied, ResourceExhausted
from shared.security.identity import Identity, Role

MAX_LAST_ERROR_CHARS = 1000
"""A pod's last_error is kept (and shown in Status) up to this length."""


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
    owner: str = ""
    """Key id of the credential that registered the pod ("" = an internal caller, no identity)."""
    trusted: bool = True
    """Reported by a service credential (or anonymously on a server without keys): counts for canaries."""


@dataclass(frozen=True)
class CanaryTally:
    """Requests on one canary version, summed over the live trusted pods that report it."""

    requests: int = 0
    errors: int = 0
    healthy: int = 0
    """Requests of pods that report no canary error and no last_error."""
    pods: int = 0
    first_error: str = ""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def _trusted(identity: Identity | None) -> bool:
    return identity is None or identity.role in (Role.SERVICE, Role.ANONYMOUS)


class PodRegistry:
    """Latest heartbeat per (model, pod), in memory: pods beat every few seconds, so a restart of the
    weights service recovers the picture within one heartbeat interval. With `share`, the heartbeats other
    weights replicas received count too (pod_share.py): every view below is of all pods, newest heartbeat
    first, whichever replica a pod beats to."""

    def __init__(self, *, max_pods_per_identity: int = 256, max_pods: int = 1024, forget_s: float = 600.0,
                 share: PodShare | None = None) -> None:
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._lock = threading.Lock()
        self.max_pods_per_identity = max_pods_per_identity
        self.max_pods = max_pods
        self.forget_s = forget_s
        self.share = share

    def publish(self, now: float | None = None) -> None:
        """Write this replica's heartbeats for the other replicas (no-op without `share`)."""
        if self.share is None:
            return
        now = time.time() if now is None else now
        with self._lock:
            self._expire(now, self.forget_s)
            mine = [SharedPod(m, p.heartbeat, p.received_at, p.off_target_since, p.owner, p.trusted)
                    for (m, _), p in self._pods.items()]
        self.share.write(mine, forget_s=self.forget_s, now=now)

    def _all(self, now: float, forget_s: float) -> dict[tuple[str, str], _Pod]:
        """Under the lock: own and other replicas' pods, the newest heartbeat of each, none older than `forget_s`."""
        self._expire(now, forget_s)
        out = dict(self._pods)
        for sp in self.share.peers() if self.share is not None else []:
            key = (sp.model, sp.heartbeat.pod_id)
            mine = out.get(key)
            if now - sp.received_at <= forget_s and (mine is None or sp.received_at > mine.received_at):
                out[key] = _Pod(sp.heartbeat, sp.received_at, sp.off_target_since, sp.owner, sp.trusted)
        return out

    def _expire(self, now: float, forget_s: float) -> None:
        """Under the lock: drop pods silent for longer than `forget_s`."""
        for key in [k for k, p in self._pods.items() if now - p.received_at > forget_s]:
            del self._pods[key]

    def record(self, hb: weights_pb2.PodHeartbeat, state: ModelState, now: float | None = None, *,
               identity: Identity | None = None) -> bool:
        """Store a heartbeat from `identity` (None = an internal caller); returns whether the pod matches
        `state`. PermissionDenied when another credential registered this pod, ResourceExhausted when a
        new pod would pass a cap."""
        now = time.time() if now is None else now
        owner = identity.key_id if identity is not None else ""
        if len(hb.last_error) > MAX_LAST_ERROR_CHARS:
            short = weights_pb2.PodHeartbeat()
            short.CopyFrom(hb)  # a copy: the caller's message stays as it was
            short.last_error = hb.last_error[:MAX_LAST_ERROR_CHARS] + "..."
            hb = short
        converged = not mismatches(hb, expected_of(state))
        with self._lock:
            known = self._all(now, self.forget_s)       # a pod another replica knows keeps its owner here
            prev = known.get((hb.model, hb.pod_id))
            if prev is not None and prev.owner != owner:
                raise PermissionDenied(f"pod {hb.pod_id!r} of {hb.model} is registered by another credential; "
                                       f"a pod reports with its own credential (or pick another pod id)")
            if prev is None:
                mine = sum(p.owner == owner for p in known.values())
                if mine >= self.max_pods_per_identity:
                    raise ResourceExhausted(f"credential {owner or 'internal'!r} already has {mine} pods registered, "
                                            "the limit (APPRENTICE_WEIGHTS_MAX_PODS_PER_IDENTITY); silent pods expire "
                                            f"after {self.forget_s:g}s")
                if len(known) >= self.max_pods:
                    raise ResourceExhausted(f"{len(known)} pods are registered, the server's limit "
                                            "(APPRENTICE_WEIGHTS_MAX_PODS); silent pods expire after "
                                            f"{self.forget_s:g}s")
            since = None if converged else (prev.off_target_since if prev and prev.off_target_since else now)
            self._pods[(hb.model, hb.pod_id)] = _Pod(hb, now, since, owner, _trusted(identity))
        return converged

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    def pods(self, model: str, forget_s: float, now: float | None = None) -> list[tuple[weights_pb2.PodHeartbeat,
                                                                                          float, float | None]]:
        now = time.time() if now is None else now
        with self._lock:
            return [(p.heartbeat, p.received_at, p.off_target_since)
                    for (m, _), p in sorted(self._all(now, forget_s).items()) if m == model]

    def _live_trusted(self, model: str, version: str, heartbeat_timeout_s: float,
                      now: float) -> list[weights_pb2.PodHeartbeat]:
        """Heartbeats of trusted pods of `model` that beat within the timeout and report canary `version`."""
        with self._lock:
            pods = [p for (m, _), p in sorted(self._all(now, self.forget_s).items()) if m == model and p.trusted
                    and now - p.received_at <= heartbeat_timeout_s]
        out = []
        for p in pods:
            hb = p.heartbeat
            if version in set(hb.tenant_canaries.values()) | ({hb.canary_version} if hb.canary_version else set()):
                out.append(hb)
        return out

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
        t = self.canary_tally(model, version, heartbeat_timeout_s=heartbeat_timeout_s, now=now)
        return t.healthy, t.errors, t.first_error

    def canary_tally(self, model: str, version: str, *, heartbeat_timeout_s: float,
                     now: float | None = None) -> CanaryTally:
        """Requests and errors on canary `version`, summed over live pods reported by trusted credentials."""
        now = time.time() if now is None else now
        requests = errors = healthy = 0
        error = ""
        pods = self._live_trusted(model, version, heartbeat_timeout_s, now)
        for hb in pods:
            requests += hb.canary_requests
            if hb.canary_errors > 0:
                errors += hb.canary_errors
                error = error or f"pod {hb.pod_id}: {hb.canary_errors} failed requests ({hb.last_error or 'no detail'})"
            elif not hb.last_error:
                healthy += hb.canary_requests
        return CanaryTally(requests=requests, errors=errors, healthy=healthy, pods=len(pods), first_error=error)
