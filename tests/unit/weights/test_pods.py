"""Heartbeats --> convergence, lagging after the deadline, canary health (time injected)."""

from __future__ import annotations

from services.weights.manifests import ModelState
from services.weights.pods import PodRegistry
from shared.contracts.orders import Slot
from shared.proto.apprentice.v1 import weights_pb2


def hb(pod: str, serving: str, **kw: object) -> weights_pb2.PodHeartbeat:
    return weights_pb2.PodHeartbeat(pod_id=pod, model="m", serving_version=serving, **kw)  # type: ignore[arg-type]


def status(reg: PodRegistry, state: ModelState, now: float) -> weights_pb2.StatusResponse:
    return reg.status(state, order_deadline_s=30, heartbeat_timeout_s=10, forget_s=600, now=now)


def test_converges_when_every_pod_serves_the_promoted_version() -> None:
    reg = PodRegistry()
    state = ModelState(model="m", slots={"": Slot(promoted="v2")}, last_order_at=100.0)
    reg.record(hb("a", "v2"), state, now=101)
    reg.record(hb("b", "v1"), state, now=101)
    st = status(reg, state, now=105)
    assert st.promoted_version == "v2" and not st.converged
    a, b = st.pods
    assert a.converged and not b.converged and not b.lagging  # still within the deadline
    assert "serves 'v1', ordered 'v2'" in b.detail
    reg.record(hb("a", "v2"), state, now=139)
    reg.record(hb("b", "v1"), state, now=139)  # still beating, still on the old version
    st = status(reg, state, now=140)
    assert st.pods[1].lagging and st.lagging_pods == 1 and st.pods[1].detail.startswith("lagging")
    reg.record(hb("b", "v2"), state, now=141)
    assert status(reg, state, now=142).converged


def test_silent_pod_is_not_converged_and_lags() -> None:
    reg = PodRegistry()
    state = ModelState(model="m")  # nothing promoted: everyone on base
    reg.record(hb("a", "base"), state, now=0)
    assert status(reg, state, now=5).converged
    st = status(reg, state, now=20)
    assert not st.converged and "no heartbeat for 20s" in st.pods[0].detail and not st.pods[0].lagging
    assert status(reg, state, now=40).pods[0].lagging
    assert reg.pods("m", forget_s=600, now=700) == []  # forgotten after pod_forget_s


def test_tenant_slots_and_canaries() -> None:
    reg = PodRegistry()
    state = ModelState(model="m", slots={"": Slot(promoted="v1"), "acme": Slot(promoted="v3", canary="v4")})
    ok = hb("a", "v1", tenant_versions={"": "v1", "acme": "v3"}, tenant_canaries={"acme": "v4"})
    missing = hb("b", "v1", tenant_versions={"": "v1"})
    assert reg.record(ok, state, now=0) and not reg.record(missing, state, now=0)
    st = status(reg, state, now=1)
    assert dict(st.tenant_versions) == {"": "v1", "acme": "v3"} and dict(st.tenant_canaries) == {"acme": "v4"}
    assert "tenant 'acme' serves 'v1', ordered 'v3'" in st.pods[1].detail
    assert "tenant 'acme' canary 'none', ordered 'v4'" in st.pods[1].detail
    # a pod that does not fill tenant_canaries is judged by canary_version
    assert reg.record(hb("c", "v1", tenant_versions={"acme": "v3"}, canary_version="v4"), state, now=0)
    assert not reg.record(hb("d", "v1", canary_version="v9"), ModelState(model="m"), now=0)


def test_canary_health_counts_healthy_requests_only() -> None:
    reg = PodRegistry()
    state = ModelState(model="m", slots={"": Slot(promoted="v1", canary="v2")})
    reg.record(hb("a", "v1", canary_version="v2", canary_requests=7), state, now=0)
    reg.record(hb("b", "v1", canary_version="v2", canary_requests=5, last_error="oom once"), state, now=0)
    reg.record(hb("c", "v1", canary_version="v9", canary_requests=50), state, now=0)
    assert reg.canary_health("m", "v2", heartbeat_timeout_s=10, now=1) == (7, 0, "")
    reg.record(hb("b", "v1", canary_version="v2", canary_requests=6, canary_errors=2, last_error="NaN logits"),
               state, now=2)
    healthy, failed, error = reg.canary_health("m", "v2", heartbeat_timeout_s=10, now=3)
    assert (healthy, failed) == (7, 2) and "NaN logits" in error
    assert reg.canary_health("m", "v2", heartbeat_timeout_s=10, now=100) == (0, 0, "")  # stale pods ignored
