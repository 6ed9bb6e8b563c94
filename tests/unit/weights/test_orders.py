"""OrderDesk: orders go out before state changes; statuses, slots and rollback targets follow."""

from __future__ import annotations

import pytest

from services.weights.orders import OrderDesk
from services.weights.pods import PodRegistry
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.rpc.grpc_util import FailedPrecondition, Unavailable

from .conftest import UploadFn

S = weights_pb2
A = events_pb2


class Recorder:
    """Collects orders like the topic would; `fail` simulates Kafka refusing them."""

    def __init__(self) -> None:
        self.sent: list[events_pb2.ModelUpdate] = []
        self.fail = False

    def __call__(self, update: events_pb2.ModelUpdate) -> None:
        if self.fail:
            raise Unavailable("broker down")
        self.sent.append(update)


def approve(store: WeightStore, version: str, model: str = "m") -> None:
    store.update(model, version, lambda m: setattr(m, "status", S.VERSION_STATUS_APPROVED))


@pytest.fixture
def desk(store: WeightStore) -> tuple[OrderDesk, Recorder]:
    rec = Recorder()
    return OrderDesk(store, rec, source="test", weights_endpoint="w:1"), rec


def status(store: WeightStore, v: str) -> str:
    return S.VersionStatus.Name(store.get("m", v).status).removeprefix("VERSION_STATUS_")


def test_promote_then_rollback(store: WeightStore, upload: UploadFn, desk: tuple[OrderDesk, Recorder]) -> None:
    d, rec = desk
    for i in range(3):
        upload({"w": f"w{i}".encode()})
        approve(store, f"v{i + 1}")
    d.promote("m", "v1", reason="first")
    ack = d.promote("m", "v2")
    assert ack.action == "promote" and ack.version == "v2" and ack.order_id == rec.sent[-1].envelope.event_id
    u = rec.sent[-1]
    assert (u.action, u.version, u.previous_version, u.kind, u.tenant, u.weights_endpoint) == (
        A.UPDATE_ACTION_PROMOTE, "v2", "v1", "full", "", "w:1")
    assert (status(store, "v1"), status(store, "v2")) == ("RETIRED", "PROMOTED")
    st = store.state("m")
    assert st.serving_for("") == "v2" and st.slot("").history == ("base", "v1") and st.last_order_id == ack.order_id

    d.rollback("m", reason="bad answers")  # to the previous promoted version
    u = rec.sent[-1]
    assert (u.action, u.version, u.previous_version) == (A.UPDATE_ACTION_ROLLBACK, "v1", "v2")
    assert (status(store, "v1"), status(store, "v2")) == ("PROMOTED", "ROLLED_BACK")
    assert "bad answers" in store.get("m", "v1").status_reason
    with pytest.raises(FailedPrecondition, match="was rolled back"):
        d.promote("m", "v2")  # needs force now
    d.rollback("m")
    assert rec.sent[-1].version == "base" and store.state("m").serving_for("") == "base"
    with pytest.raises(FailedPrecondition, match="no previous version"):
        d.rollback("m")
    d.rollback("m", "v3")  # explicit target
    assert store.state("m").serving_for("") == "v3"


def test_gate_admission(store: WeightStore, upload: UploadFn, desk: tuple[OrderDesk, Recorder]) -> None:
    d, rec = desk
    upload({"w": b"1"})
    with pytest.raises(FailedPrecondition, match="not been evaluated"):
        d.promote("m", "v1")  # no gate configured here

    def reject(m: weights_pb2.Manifest) -> weights_pb2.Manifest:
        def r(x: weights_pb2.Manifest) -> None:
            x.status, x.status_reason = S.VERSION_STATUS_REJECTED, "blocked: ood/ref_loglik"
        return store.update(m.model, m.version, r)

    d.gate = reject
    with pytest.raises(FailedPrecondition, match="rejected by the eval gate: blocked: ood/ref_loglik"):
        d.promote("m", "v1")
    assert rec.sent == [] and store.state("m").serving_for("") == "base"
    d.promote("m", "v1", force=True, reason="operator knows")
    assert rec.sent[-1].version == "v1" and status(store, "v1") == "PROMOTED"


def test_nothing_changes_when_the_order_cannot_be_sent(store: WeightStore, upload: UploadFn,
                                                       desk: tuple[OrderDesk, Recorder]) -> None:
    d, rec = desk
    upload({"w": b"1"})
    approve(store, "v1")
    rec.fail = True
    with pytest.raises(Unavailable):
        d.promote("m", "v1")
    assert store.state("m").serving_for("") == "base" and status(store, "v1") == "APPROVED"


def test_canary_promote_and_abort(store: WeightStore, upload: UploadFn, desk: tuple[OrderDesk, Recorder]) -> None:
    d, rec = desk
    for i in range(3):
        upload({"w": f"w{i}".encode()})
        approve(store, f"v{i + 1}")
    d.promote("m", "v1")
    d.canary("m", "v2", 0.25)
    u = rec.sent[-1]
    assert (u.action, u.version, u.canary_fraction, u.previous_version) == (A.UPDATE_ACTION_CANARY, "v2", 0.25, "v1")
    assert status(store, "v2") == "CANARY"
    with pytest.raises(Exception, match=r"fraction must be in \(0, 1\]"):
        d.canary("m", "v3", 1.5)
    d.rollback("m")  # aborts the canary, keeps v1
    u = rec.sent[-1]
    assert (u.action, u.version, u.previous_version) == (A.UPDATE_ACTION_ROLLBACK, "v1", "v2")
    assert status(store, "v2") == "ROLLED_BACK" and store.state("m").slot("").canary == ""
    d.canary("m", "v3", 0.5)
    d.promote("m", "v2", force=True)  # another version: the v3 canary keeps running against it
    assert store.state("m").slot("").canary == "v3" and status(store, "v3") == "CANARY"
    d.promote("m", "v3")  # the canary graduates
    assert store.state("m").slot("").canary == "" and status(store, "v3") == "PROMOTED"
    assert status(store, "v2") == "RETIRED"


def test_tenant_slots(store: WeightStore, upload: UploadFn, desk: tuple[OrderDesk, Recorder]) -> None:
    d, rec = desk
    upload({"w": b"op"})                      # v1, operator version
    upload({"w": b"acme"}, tenant="acme")     # v2, trained on acme's data only
    approve(store, "v1")
    approve(store, "v2")
    d.promote("m", "v1")
    d.promote("m", "v2")
    assert rec.sent[-1].tenant == "acme" and rec.sent[-1].envelope.tenant == "acme"
    assert rec.sent[-1].previous_version == "v1"  # acme was following the operator slot
    st = store.state("m")
    assert st.serving_for("acme") == "v2" and st.serving_for("other") == "v1"
    assert status(store, "v1") == "PROMOTED"  # still served to everyone else
    with pytest.raises(FailedPrecondition, match="belongs to tenant '\\*'"):
        d.rollback("m", "v1", tenant="acme")
    d.rollback("m", tenant="acme")
    assert rec.sent[-1].tenant == "acme" and rec.sent[-1].version == "v1"
    desired = {(u.tenant, u.action, u.version) for u in d.desired("m")}
    assert desired == {("", A.UPDATE_ACTION_PROMOTE, "v1"), ("acme", A.UPDATE_ACTION_PROMOTE, "v1")}
    assert [u.envelope.event_id for u in d.desired("m")] == [u.envelope.event_id for u in d.desired("m")]


def test_canary_review(store: WeightStore, upload: UploadFn, desk: tuple[OrderDesk, Recorder]) -> None:
    d, rec = desk
    for i in range(3):
        upload({"w": f"w{i}".encode()})
        approve(store, f"v{i + 1}")
    d.canary("m", "v1", 0.1)
    pods = PodRegistry()
    state = store.state("m")
    pods.record(weights_pb2.PodHeartbeat(pod_id="p", model="m", serving_version="base", canary_version="v1",
                                         canary_requests=3), state)
    assert d.review_canaries("m", pods, min_requests=5, auto_promote=True, heartbeat_timeout_s=30) == []
    pods.record(weights_pb2.PodHeartbeat(pod_id="p", model="m", serving_version="base", canary_version="v1",
                                         canary_requests=5), state)
    acks = d.review_canaries("m", pods, min_requests=5, auto_promote=True, heartbeat_timeout_s=30)
    assert [a.action for a in acks] == ["promote"] and store.state("m").serving_for("") == "v1"
    d.canary("m", "v2", 0.1)
    pods.record(weights_pb2.PodHeartbeat(pod_id="p", model="m", serving_version="v1", canary_version="v2",
                                         canary_requests=9, canary_errors=1, last_error="boom"), store.state("m"))
    acks = d.review_canaries("m", pods, min_requests=5, auto_promote=True, heartbeat_timeout_s=30)
    assert [a.action for a in acks] == ["rollback"] and status(store, "v2") == "ROLLED_BACK"
    assert "canary v2 failed" in rec.sent[-1].reason


def test_a_replica_that_dies_between_publishing_and_saving_is_retried_with_the_same_order_id(
        store: WeightStore, upload: UploadFn, desk: tuple[OrderDesk, Recorder],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two weights replicas share a store: one publishes a promote and dies before saving the state; the
    other, retrying the caller's request, must send the same order id (consumers count one order), while
    every later order, even one for the same version, gets a new one."""
    d, rec = desk
    upload({"w": b"w0"})
    approve(store, "v1")

    def crash(_state: object) -> None:
        raise SystemExit("kill -9 after the order was durable")

    with monkeypatch.context() as m:
        m.setattr(store, "save_state", crash)
        with pytest.raises(SystemExit):
            d.promote("m", "v1")
    first = rec.sent[-1].envelope.event_id
    other = OrderDesk(store, rec, source="test", weights_endpoint="w:1")      # the surviving replica
    assert other.promote("m", "v1").order_id == first and len(rec.sent) == 2
    assert store.state("m").last_order_id == first
    rollback = d.rollback("m", "base", tenant="").order_id
    again = d.promote("m", "v1", force=True).order_id
    assert len({first, rollback, again}) == 3
