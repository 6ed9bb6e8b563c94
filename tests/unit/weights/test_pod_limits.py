"""Pod registry limits: caps per credential and in all, ownership of a pod id, expiry, trusted canary reports."""

from __future__ import annotations

import pytest

from services.weights.manifests import ModelState
from services.weights.pods import MAX_LAST_ERROR_CHARS, PodRegistry
from shared.contracts.orders import Slot
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import PermissionDenied, ResourceExhausted
from shared.security.identity import Identity, Role

POD_A = Identity("pods-a", Role.SERVICE)
POD_B = Identity("pods-b", Role.SERVICE)
OPERATOR = Identity("alice", Role.OPERATOR)
STATE = ModelState(model="m", slots={"": Slot(promoted="v1", canary="v2")})


def hb(pod: str, **kw: object) -> weights_pb2.PodHeartbeat:
    return weights_pb2.PodHeartbeat(pod_id=pod, model="m", serving_version="v1", canary_version="v2",
                                    **kw)  # type: ignore[arg-type]


def test_caps_per_identity_and_total() -> None:
    reg = PodRegistry(max_pods_per_identity=3, max_pods=5, forget_s=60)
    for i in range(3):
        reg.record(hb(f"a{i}"), STATE, now=0, identity=POD_A)
    reg.record(hb("a0"), STATE, now=1, identity=POD_A)  # a known pod beats again: not a new one
    with pytest.raises(ResourceExhausted, match="'pods-a' already has 3 pods registered"):
        reg.record(hb("a3"), STATE, now=1, identity=POD_A)
    reg.record(hb("b0"), STATE, now=1, identity=POD_B)
    reg.record(hb("b1"), STATE, now=1, identity=POD_B)
    with pytest.raises(ResourceExhausted, match="5 pods are registered, the server's limit"):
        reg.record(hb("b2"), STATE, now=1, identity=POD_B)
    assert len(reg) == 5
    # silent pods expire, and their places are free again
    reg.record(hb("a3"), STATE, now=61.5, identity=POD_A)
    assert len(reg) == 1


def test_a_pod_id_belongs_to_the_credential_that_registered_it() -> None:
    reg = PodRegistry()
    reg.record(hb("p", canary_requests=10), STATE, now=0, identity=POD_A)
    with pytest.raises(PermissionDenied, match="registered by another credential"):
        reg.record(hb("p", canary_requests=10, canary_errors=10), STATE, now=1, identity=POD_B)
    assert reg.canary_tally("m", "v2", heartbeat_timeout_s=30, now=2).errors == 0


def test_only_trusted_reports_count_for_canaries() -> None:
    reg = PodRegistry()
    reg.record(hb("svc", canary_requests=8, canary_errors=1, last_error="x"), STATE, now=0, identity=POD_A)
    reg.record(hb("dev", canary_requests=4), STATE, now=0,
               identity=Identity("anonymous", Role.ANONYMOUS))  # a server without keys
    reg.record(hb("op", canary_requests=100, canary_errors=100), STATE, now=0, identity=OPERATOR)
    t = reg.canary_tally("m", "v2", heartbeat_timeout_s=30, now=1)
    assert (t.requests, t.errors, t.healthy, t.pods) == (12, 1, 4, 2)
    assert t.error_rate == pytest.approx(1 / 12) and t.first_error == "pod svc: 1 failed requests (x)"


def test_long_errors_are_cut() -> None:
    reg = PodRegistry()
    msg = hb("p", last_error="e" * 5000)
    reg.record(msg, STATE, now=0)
    (kept, _, _), = reg.pods("m", forget_s=60, now=0)
    assert len(kept.last_error) == MAX_LAST_ERROR_CHARS + 3 and len(msg.last_error) == 5000
