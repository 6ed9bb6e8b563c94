"""Two weights replicas over one store: each pod beats to one of them, and both see every pod, its newest
heartbeat, its owner and its canary requests (pod_share.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from services.weights.manifests import ModelState
from services.weights.pod_share import PodShare
from services.weights.pods import PodRegistry
from shared.contracts.orders import Slot
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import PermissionDenied
from shared.security.identity import Identity, Role


def hb(pod: str, serving: str, **kw: object) -> weights_pb2.PodHeartbeat:
    return weights_pb2.PodHeartbeat(pod_id=pod, model="m", serving_version=serving, **kw)  # type: ignore[arg-type]


def replicas(tmp_path: Path) -> tuple[PodRegistry, PodRegistry]:
    return (PodRegistry(share=PodShare(tmp_path / "pods", "weights-0", cache_s=0)),
            PodRegistry(share=PodShare(tmp_path / "pods", "weights-1", cache_s=0)))


def test_each_replica_sees_the_pods_that_beat_to_the_other(tmp_path: Path) -> None:
    a, b = replicas(tmp_path)
    state = ModelState(model="m", slots={"": Slot(promoted="v2")}, last_order_at=100.0)
    a.record(hb("pod-0", "v2"), state, now=101)
    b.record(hb("pod-1", "v1"), state, now=101)
    a.publish(now=101)
    b.publish(now=101)
    for reg in (a, b):
        st = reg.status(state, order_deadline_s=30, heartbeat_timeout_s=10, forget_s=600, now=102)
        assert [(p.pod_id, p.converged) for p in st.pods] == [("pod-0", True), ("pod-1", False)]
    # pod-1 moves to replica a (b died): a's own, newer heartbeat wins over b's file
    a.record(hb("pod-1", "v2"), state, now=110)
    st = a.status(state, order_deadline_s=30, heartbeat_timeout_s=10, forget_s=600, now=111)
    assert st.converged and len(st.pods) == 2


def test_canary_requests_are_summed_over_every_replicas_pods(tmp_path: Path) -> None:
    a, b = replicas(tmp_path)
    state = ModelState(model="m", slots={"": Slot(promoted="v1", canary="v2", canary_fraction=0.5)})
    now = time.time()
    a.record(hb("pod-0", "v1", canary_version="v2", canary_requests=30), state, now=now)
    b.record(hb("pod-1", "v1", canary_version="v2", canary_requests=20, canary_errors=5), state, now=now)
    b.publish(now=now)
    t = a.canary_tally("m", "v2", heartbeat_timeout_s=10, now=now + 1)
    assert (t.requests, t.errors, t.pods, t.healthy) == (50, 5, 2, 30)


def test_a_pod_keeps_its_owner_across_replicas(tmp_path: Path) -> None:
    a, b = replicas(tmp_path)
    state = ModelState(model="m")
    owner = Identity(key_id="svc-1", role=Role.SERVICE, tenant="")
    other = Identity(key_id="svc-2", role=Role.SERVICE, tenant="")
    a.record(hb("pod-0", "base"), state, now=1, identity=owner)
    a.publish(now=1)
    with pytest.raises(PermissionDenied):
        b.record(hb("pod-0", "base"), state, now=2, identity=other)
    assert b.record(hb("pod-0", "base"), state, now=2, identity=owner)


def test_a_dead_replicas_file_ages_out_and_goes(tmp_path: Path) -> None:
    a, b = replicas(tmp_path)
    b.record(hb("pod-1", "base"), ModelState(model="m"), now=0)
    b.publish(now=0)
    assert [p.pod_id for p, _, _ in a.pods("m", forget_s=600, now=10)] == ["pod-1"]
    assert a.pods("m", forget_s=600, now=700) == []
    stale = tmp_path / "pods" / "weights-1.json"
    old = time.time() - 1000
    os.utime(stale, (old, old))
    a.publish()
    assert not stale.exists() and (tmp_path / "pods" / "weights-0.json").exists()
