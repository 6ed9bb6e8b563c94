"""OrderDesk and trust: orders are audited before they are sent (no record, no order), refusals are audited,
the integrity check cannot be forced, and one error report does not roll a canary back."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from services.weights.audit_trail import Trail
from services.weights.gate import integrity_result
from services.weights.orders import OrderDesk
from services.weights.pods import PodRegistry
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.rpc.grpc_util import FailedPrecondition, Unavailable
from shared.security.identity import Identity

from .conftest import UploadFn
from .test_orders import Recorder, approve, status

S = weights_pb2


class Sink:
    """Stands for AuditLog.record: keeps (action, target, allowed, details) and the order count at that time."""

    def __init__(self, orders: Recorder) -> None:
        self.orders = orders
        self.records: list[tuple[str, str, bool, dict[str, str], int]] = []
        self.fail = False

    def __call__(self, action: str, target: str, *, tenant: str = "", allowed: bool = True, reason: str = "",
                 details: Mapping[str, str] | None = None, identity: Identity | None = None) -> object:
        if self.fail:
            raise Unavailable("audit topic unreachable")
        self.records.append((action, target, allowed, dict(details or {}), len(self.orders.sent)))
        return None


@pytest.fixture
def desk(store: WeightStore) -> tuple[OrderDesk, Recorder, Sink]:
    rec = Recorder()
    sink = Sink(rec)
    return OrderDesk(store, rec, source="test", audit=Trail(sink)), rec, sink


class Integrity:
    """An integrity checker recording its result as the evaluator's does, with the verdict given; counts calls."""

    def __init__(self, store: WeightStore, bad: bool) -> None:
        self.store, self.bad = store, bad
        self.calls: list[str] = []

    def __call__(self, m: weights_pb2.Manifest) -> weights_pb2.Manifest:
        self.calls.append(m.version)

        def record(x: weights_pb2.Manifest) -> None:
            x.eval_results.append(integrity_result(["model.safetensors:w"] if self.bad else [], 1))
            if self.bad:
                x.status = S.VERSION_STATUS_REJECTED
        return self.store.update(m.model, m.version, record)


def test_each_order_is_audited_before_it_is_sent(store: WeightStore, upload: UploadFn,
                                                 desk: tuple[OrderDesk, Recorder, Sink]) -> None:
    d, rec, sink = desk
    for i in range(2):
        upload({"w": f"w{i}".encode()})
        approve(store, f"v{i + 1}")
    d.promote("m", "v1", reason="first")
    d.canary("m", "v2", 0.5)
    d.rollback("m", reason="worse")
    assert [(a, t, ok, n) for a, t, ok, _, n in sink.records] == [
        ("weights.promote", "m/v1", True, 0), ("weights.canary", "m/v2", True, 1), ("weights.rollback", "m/v1", True, 2)]
    assert sink.records[0][3]["force"] == "false" and sink.records[1][3]["fraction"] == "0.5"
    assert len(rec.sent) == 3


def test_no_audit_record_no_order(store: WeightStore, upload: UploadFn,
                                  desk: tuple[OrderDesk, Recorder, Sink]) -> None:
    d, rec, sink = desk
    upload({"w": b"1"})
    approve(store, "v1")
    sink.fail = True
    with pytest.raises(Unavailable, match="audit topic unreachable"):
        d.promote("m", "v1")
    assert rec.sent == [] and store.state("m").serving_for("") == "base" and status(store, "v1") == "APPROVED"


def test_audit_sink_errors_become_unavailable(store: WeightStore, upload: UploadFn) -> None:
    def broken(*_a: object, **_k: object) -> object:
        raise RuntimeError("producer closed")

    rec = Recorder()
    d = OrderDesk(store, rec, audit=Trail(broken))
    upload({"w": b"1"})
    approve(store, "v1")
    with pytest.raises(Unavailable, match="audit record for weights.promote m/v1 not written"):
        d.promote("m", "v1")
    assert rec.sent == []


def test_integrity_cannot_be_forced(store: WeightStore, upload: UploadFn,
                                    desk: tuple[OrderDesk, Recorder, Sink]) -> None:
    d, rec, sink = desk
    upload({"w": b"nan"})  # v1: never evaluated
    check = d.integrity = Integrity(store, bad=True)
    with pytest.raises(FailedPrecondition, match="failed the integrity check .*force does not override"):
        d.promote("m", "v1", force=True)
    assert check.calls == ["v1"]
    assert status(store, "v1") == "REJECTED" and rec.sent == []
    with pytest.raises(FailedPrecondition, match="failed the integrity check"):
        d.promote("m", "v1", force=True)  # recorded now: not checked again
    assert check.calls == ["v1"]
    with pytest.raises(FailedPrecondition, match="failed the integrity check"):
        d.rollback("m", "v1")  # nor by naming it as a rollback target
    assert rec.sent == [] and store.state("m").serving_for("") == "base"
    refused = [(a, ok) for a, _, ok, _, _ in sink.records]
    assert refused == [("weights.promote", False), ("weights.promote", False), ("weights.rollback", False)]


def test_force_still_overrides_the_scores(store: WeightStore, upload: UploadFn,
                                          desk: tuple[OrderDesk, Recorder, Sink]) -> None:
    """A version the gate rejected for its scores, with finite weights: an operator may still force it."""
    d, rec, sink = desk
    upload({"w": b"ok"})
    d.integrity = Integrity(store, bad=False)

    def reject(m: weights_pb2.Manifest) -> weights_pb2.Manifest:
        def r(x: weights_pb2.Manifest) -> None:
            x.status, x.status_reason = S.VERSION_STATUS_REJECTED, "blocked: ood/ref_loglik"
        return store.update(m.model, m.version, r)

    d.gate = reject
    with pytest.raises(FailedPrecondition, match="rejected by the eval gate: blocked: ood/ref_loglik"):
        d.promote("m", "v1")
    d.promote("m", "v1", force=True, reason="operator knows")
    assert rec.sent[-1].version == "v1" and status(store, "v1") == "PROMOTED"
    assert [(a, ok, det.get("force")) for a, _, ok, det, _ in sink.records] == [
        ("weights.promote", False, None), ("weights.promote", True, "true")]


def review(d: OrderDesk, pods: PodRegistry) -> list[str]:
    return [a.action for a in d.review_canaries("m", pods, min_requests=1000, auto_promote=True,
                                                heartbeat_timeout_s=1e9, rollback_min_requests=10,
                                                max_error_rate=0.2)]


def test_one_error_report_does_not_roll_a_canary_back(store: WeightStore, upload: UploadFn,
                                                      desk: tuple[OrderDesk, Recorder, Sink]) -> None:
    d, rec, _ = desk
    for i in range(2):
        upload({"w": f"w{i}".encode()})
        approve(store, f"v{i + 1}")
    d.promote("m", "v1")
    d.canary("m", "v2", 0.1)
    pods = PodRegistry()
    beat = lambda pod, n, e: pods.record(weights_pb2.PodHeartbeat(  # noqa: E731
        pod_id=pod, model="m", serving_version="v1", canary_version="v2", canary_requests=n, canary_errors=e),
        store.state("m"))
    beat("forged", 1, 1)
    assert review(d, pods) == []          # 1 request: below the minimum, whatever its error rate
    beat("a", 30, 5)
    assert review(d, pods) == []          # 6 of 31 = 19%: within 20%
    beat("b", 10, 3)
    assert review(d, pods) == ["rollback"]  # 9 of 41 = 22%, summed over the pods
    assert rec.sent[-1].action == events_pb2.UPDATE_ACTION_ROLLBACK and "failed on 3 pods" in rec.sent[-1].reason
