"""Authentication, authorisation, TLS and binding on the real servers (Weights, Knowledge, Inference with
the tiny model) on loopback, started with the environment `apprentice up` gives them.

Attacks covered here (SECURITY.md §4): an anonymous client promoting with force and rolling
back on the Weights port; anonymous Knowledge edits; every gRPC server bound 0.0.0.0 without TLS; metrics
on 0.0.0.0; tenant B's key sending feedback on tenant A's interaction; a feedback flood on one
interaction. Each test fails on a server without the security layer (it answered OK to anyone, in clear).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shared.metrics import start_metrics_server
from shared.proto.apprentice.v1 import (
    inference_pb2,
    inference_pb2_grpc,
    weights_pb2,
    weights_pb2_grpc,
)
from shared.rpc.grpc_util import PortInUse, create_server, service_host
from shared.security import interaction_ids, policy
from shared.security.binding import InsecureBind
from shared.security.identity import Role
from shared.settings import CommonSettings
from tests.helpers.kafka import read_all
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for
from tests.helpers.weights import start_weights
from tests.security.conftest import FEEDBACK_CAP, SecureStack
from tests.security.harness import (
    INFERENCE_RPCS,
    KNOWLEDGE_RPCS,
    SERVING,
    TENANT_A,
    TENANT_B,
    WEIGHTS_RPCS,
    Dialer,
    Rpc,
    call_raw,
    code_of,
    connects,
    health,
    non_loopback_ip,
    rpc_error,
)
from tools.devca import DevCredentials

pytestmark = pytest.mark.integration
MODEL = "tiny-random"
ALL_RPCS = INFERENCE_RPCS + KNOWLEDGE_RPCS + WEIGHTS_RPCS
C = grpc.StatusCode


@pytest.fixture(scope="module")
def targets(weights_server: Any, knowledge_server: Any, inference_server: Any) -> dict[str, str]:
    """Service full name --> the loopback address of the server that serves it."""
    w, k, i = (f"127.0.0.1:{s.port}" for s in (weights_server, knowledge_server, inference_server))
    return {"apprentice.v1.Weights": w, "apprentice.v1.Knowledge": k, "apprentice.v1.Inference": i,
            "apprentice.v1.Feedback": i}


def _ids(rpcs: list[Rpc]) -> list[str]:
    return [r.path.lstrip("/").replace("apprentice.v1.", "") for r in rpcs]


# --- who may call ----------------------------------------------------------------------------------
@pytest.mark.parametrize("caller", ["anonymous", "unknown_key"])
@pytest.mark.parametrize("rpc", ALL_RPCS, ids=_ids(ALL_RPCS))
def test_unauthenticated_callers_are_refused_on_every_rpc(rpc: Rpc, caller: str, secure_stack: SecureStack,
                                                          targets: dict[str, str]) -> None:
    channel = getattr(secure_stack.dial, caller)(targets[rpc.service])
    assert call_raw(channel, rpc, [b""]) == C.UNAUTHENTICATED


@pytest.mark.parametrize("header", ["Basic b3BlcmF0b3I6cGFzc3dvcmQ=", "Bearer", "Bearer   ", "operator-key"])
def test_malformed_authorization_is_refused(header: str, secure_stack: SecureStack, targets: dict[str, str]) -> None:
    rpc = next(r for r in WEIGHTS_RPCS if r.name == "List")
    channel = secure_stack.dial.anonymous(targets[rpc.service])
    assert call_raw(channel, rpc, [b""], metadata=[("authorization", header)]) == C.UNAUTHENTICATED


OPERATOR_ONLY = [r for r in WEIGHTS_RPCS + KNOWLEDGE_RPCS
                 if r.name in ("Promote", "Rollback", "Canary", "Pin", "Heartbeat", "Upload", "Approve",
                               "Reject", "Edit")]


@pytest.mark.parametrize("rpc", OPERATOR_ONLY, ids=_ids(OPERATOR_ONLY))
def test_backend_keys_may_not_change_models_or_knowledge(rpc: Rpc, secure_stack: SecureStack,
                                                         targets: dict[str, str]) -> None:
    channel = secure_stack.dial.backend(targets[rpc.service], TENANT_A)
    assert call_raw(channel, rpc, [b""]) == C.PERMISSION_DENIED


@pytest.mark.parametrize("rpc", [r for r in WEIGHTS_RPCS if r.name in ("Download", "List", "Get", "Status")],
                         ids=lambda r: r.name)
def test_backend_keys_may_not_read_the_weights_store(rpc: Rpc, secure_stack: SecureStack,
                                                     targets: dict[str, str]) -> None:
    assert call_raw(secure_stack.dial.backend(targets[rpc.service], TENANT_B), rpc, [b""]) == C.PERMISSION_DENIED


SERVICE_DENIED = [r for r in WEIGHTS_RPCS + KNOWLEDGE_RPCS if r.name in ("Canary", "Rollback", "Pin", "Approve",
                                                                          "Reject", "Edit")]


@pytest.mark.parametrize("rpc", SERVICE_DENIED, ids=_ids(SERVICE_DENIED))
def test_service_keys_may_not_give_operator_orders(rpc: Rpc, secure_stack: SecureStack,
                                                   targets: dict[str, str]) -> None:
    assert call_raw(secure_stack.dial.service(targets[rpc.service]), rpc, [b""]) == C.PERMISSION_DENIED


@pytest.mark.parametrize("rpc", ALL_RPCS, ids=_ids(ALL_RPCS))
def test_a_metrics_key_calls_no_rpc(rpc: Rpc, secure_stack: SecureStack, targets: dict[str, str]) -> None:
    """Prometheus' key (role `metrics`) reads /metrics and nothing else (tests/security/test_metrics_role.py)."""
    token = secure_stack.creds.token(secure_stack.creds.metrics_token)
    assert call_raw(secure_stack.dial.with_token(targets[rpc.service], token), rpc, [b""]) == C.PERMISSION_DENIED


def test_only_an_operator_may_force_a_promotion(secure_stack: SecureStack, weights_server: Any) -> None:
    target = f"127.0.0.1:{weights_server.port}"
    force = weights_pb2.PromoteRequest(model=MODEL, version="v1", force=True, reason="skip the gate")
    anon = weights_pb2_grpc.WeightsStub(secure_stack.dial.anonymous(target))
    assert rpc_error(lambda: anon.Promote(force, timeout=10)).code() == C.UNAUTHENTICATED
    assert rpc_error(lambda: anon.Rollback(weights_pb2.RollbackRequest(model=MODEL), timeout=10)).code() \
        == C.UNAUTHENTICATED
    err = rpc_error(lambda: weights_pb2_grpc.WeightsStub(secure_stack.dial.service(target)).Promote(force, timeout=10))
    assert err.code() == C.PERMISSION_DENIED and "needs an operator key" in err.details()
    # the operator passes authorisation (and is told the version does not exist)
    err = rpc_error(lambda: weights_pb2_grpc.WeightsStub(secure_stack.dial.operator(target)).Promote(force, timeout=10))
    assert err.code() == C.NOT_FOUND
    # no order reached the pods
    assert read_all(secure_stack.bootstrap, secure_stack.topics.model_updates, timeout=3, idle=1) == []


def test_health_and_reflection_stay_public(secure_stack: SecureStack, targets: dict[str, str]) -> None:
    for service, target in targets.items():
        channel = secure_stack.dial.anonymous(target)
        assert health(channel) == SERVING and health(channel, service) == SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=10))
        assert service in {s.name for s in answers[0].list_services_response.service}


# --- garbage ---------------------------------------------------------------------------------------
GARBAGE = [b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 11, bytes(range(256))]


@pytest.mark.parametrize("rpc", ALL_RPCS, ids=_ids(ALL_RPCS))
def test_garbage_bytes_are_invalid_argument_and_the_server_keeps_serving(rpc: Rpc, secure_stack: SecureStack,
                                                                         targets: dict[str, str]) -> None:
    # a caller the method admits (Heartbeat is the services'): the interceptor authenticates first
    allowed = policy.allowed_roles(rpc.path)
    dial = secure_stack.dial
    channel = (dial.operator if Role.OPERATOR in allowed else dial.service)(targets[rpc.service])
    for payload in GARBAGE:
        assert call_raw(channel, rpc, [payload]) == C.INVALID_ARGUMENT, payload
    if rpc.client_streaming:   # a valid first message, garbage after it
        assert call_raw(channel, rpc, [b"", GARBAGE[0]]) == C.INVALID_ARGUMENT
    assert health(channel, rpc.service) == SERVING


# --- feedback across tenants -----------------------------------------------------------------------
def _generate(dial: Dialer, target: str, tenant: str) -> str:
    stub = inference_pb2_grpc.InferenceStub(dial.backend(target, tenant))
    r = stub.Generate(inference_pb2.GenerateRequest(prompt="hello", sampling={"max_new_tokens": 2}), timeout=60)
    return r.choices[0].interaction_id


def _feedback(channel: grpc.Channel, iid: str, *, occurred_at: datetime | None = None, tenant: str = "",
              comment: str = "Actually the answer is 42.") -> inference_pb2.FeedbackAck:
    req = inference_pb2.FeedbackRequest(interaction_id=iid, kind="correction", comment=comment, tenant=tenant)
    if occurred_at is not None:
        ts = Timestamp()
        ts.FromDatetime(occurred_at)
        req.occurred_at.CopyFrom(ts)
    return inference_pb2_grpc.FeedbackStub(channel).Submit(req, timeout=30)


def test_tenant_b_cannot_send_feedback_on_tenant_a_interactions(secure_stack: SecureStack,
                                                                inference_server: Any) -> None:
    target = f"127.0.0.1:{inference_server.port}"
    dial = secure_stack.dial
    iid = _generate(dial, target, TENANT_A)
    secret = secure_stack.creds.token(secure_stack.creds.interaction_id_secret).encode()
    assert interaction_ids.verify(iid, TENANT_A, secret) and not interaction_ids.verify(iid, TENANT_B, secret)
    b = dial.backend(target, TENANT_B)
    for forged in (iid, iid.partition(".")[0], iid.partition(".")[0] + ".aaaaaaaaaaaaaaaaaaaaaaaaaa"):
        err = rpc_error(partial(_feedback, b, forged))
        assert err.code() == C.PERMISSION_DENIED, forged
    # naming tenant A does not help: a backend key acts for its own tenant only
    assert rpc_error(lambda: _feedback(b, iid, tenant=TENANT_A)).code() == C.PERMISSION_DENIED
    assert _feedback(dial.backend(target, TENANT_A), iid).accepted


def test_feedback_flood_on_one_interaction_is_capped(secure_stack: SecureStack, inference_server: Any) -> None:
    target = f"127.0.0.1:{inference_server.port}"
    a = secure_stack.dial.backend(target, TENANT_A)
    iid = _generate(secure_stack.dial, target, TENANT_A)
    for _ in range(FEEDBACK_CAP):
        assert _feedback(a, iid).accepted
    err = rpc_error(lambda: _feedback(a, iid))
    assert err.code() == C.RESOURCE_EXHAUSTED and f"at most {FEEDBACK_CAP}" in err.details()
    assert _feedback(a, _generate(secure_stack.dial, target, TENANT_A)).accepted   # others are not affected


def test_feedback_dated_before_its_interaction_is_invalid(secure_stack: SecureStack, inference_server: Any) -> None:
    target = f"127.0.0.1:{inference_server.port}"
    a = secure_stack.dial.backend(target, TENANT_A)
    iid = _generate(secure_stack.dial, target, TENANT_A)
    issued = interaction_ids.issued_at(iid)
    assert issued is not None and abs(issued - datetime.now(UTC)) < timedelta(minutes=1)
    err = rpc_error(lambda: _feedback(a, iid, occurred_at=issued - timedelta(days=1)))
    assert err.code() == C.INVALID_ARGUMENT and "before the interaction" in err.details()
    err = rpc_error(lambda: _feedback(a, iid, occurred_at=datetime.now(UTC) + timedelta(days=1)))
    assert err.code() == C.INVALID_ARGUMENT and "in the future" in err.details()
    assert _feedback(a, iid, occurred_at=datetime.now(UTC)).accepted


# --- key rotation ----------------------------------------------------------------------------------
def test_keys_rotate_without_a_restart(secure_env: DevCredentials, dial: Dialer, tmp_path: Path) -> None:
    running = start_weights(tmp_path / "store")
    try:
        target = f"127.0.0.1:{running.port}"
        keys = secure_env.keys_file
        old = secure_env.token(secure_env.operator_token)
        new = "rotated-" + "k" * 32

        def status(token: str) -> grpc.StatusCode:
            stub = weights_pb2_grpc.WeightsStub(dial.with_token(target, token))
            return code_of(lambda: stub.List(weights_pb2.ListVersionsRequest(model=MODEL), timeout=10))

        assert status(old) == C.OK and status(new) == C.UNAUTHENTICATED
        lines = keys.read_text().splitlines()
        keys.write_text("\n".join([*lines, f"operator:local-operator={new}"]) + "\n")   # same key id, 2nd secret
        wait_for(lambda: status(new) == C.OK, what="the added key to be accepted", stall_s=10)
        assert status(old) == C.OK
        keys.write_text("\n".join([*(ln for ln in lines if old not in ln), f"operator:local-operator={new}"]) + "\n")
        wait_for(lambda: status(old) == C.UNAUTHENTICATED, what="the removed key to be refused", stall_s=10)
        assert status(new) == C.OK
    finally:
        running.stop(grace=0.5)


# --- TLS -------------------------------------------------------------------------------------------
def test_plaintext_and_foreign_ca_clients_cannot_connect(secure_stack: SecureStack, weights_server: Any,
                                                         tmp_path: Path) -> None:
    target = f"127.0.0.1:{weights_server.port}"
    req = weights_pb2.ListVersionsRequest(model=MODEL)
    for channel in (secure_stack.dial.plaintext(target), secure_stack.dial.wrong_ca(target, tmp_path / "other")):
        assert code_of(partial(weights_pb2_grpc.WeightsStub(channel).List, req, timeout=5)) == C.UNAVAILABLE
    assert code_of(lambda: weights_pb2_grpc.WeightsStub(secure_stack.dial.operator(target)).List(req, timeout=5)) \
        == C.OK


def test_mutual_tls_admits_mapped_certificates_only(secure_env: DevCredentials, dial: Dialer,
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPRENTICE_TLS_CLIENT_AUTH", "true")
    with secure_env.keys_file.open("a") as f:
        f.write("service:trainer-cert=cert:trainer.apprentice.local\n")
    running = start_weights(tmp_path / "store")
    try:
        target = f"127.0.0.1:{running.port}"
        req = weights_pb2.ListVersionsRequest(model=MODEL)

        def stub(ch: grpc.Channel) -> weights_pb2_grpc.WeightsStub:
            return weights_pb2_grpc.WeightsStub(ch)

        # no client certificate: the handshake fails, even with a valid key
        assert code_of(lambda: stub(dial.operator(target)).List(req, timeout=5)) == C.UNAVAILABLE
        # a certificate of another CA: refused at the handshake
        rogue = dial.client_cert(target, "trainer.apprentice.local", ca_directory=tmp_path / "rogue")
        assert code_of(lambda: stub(rogue).List(req, timeout=5)) == C.UNAVAILABLE
        # a certificate of our CA that no key entry maps: authenticated transport, unknown identity
        err = rpc_error(lambda: stub(dial.client_cert(target, "stranger.local")).List(req, timeout=5))
        assert err.code() == C.UNAUTHENTICATED and "not mapped" in err.details()
        # the mapped certificate is the service identity `trainer-cert`: reads, but gives no orders
        trainer = stub(dial.client_cert(target, "trainer.apprentice.local"))
        assert code_of(lambda: trainer.List(req, timeout=5)) == C.OK
        err = rpc_error(lambda: trainer.Canary(weights_pb2.CanaryRequest(model=MODEL, version="v1"), timeout=5))
        assert err.code() == C.PERMISSION_DENIED and "'trainer-cert'" in err.details()
    finally:
        running.stop(grace=0.5)


# --- binding ---------------------------------------------------------------------------------------
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.security.harness import SECURITY_VARS

    for name in SECURITY_VARS:
        monkeypatch.delenv(name, raising=False)


def _bare_server(host: str, port: int = 0, common: CommonSettings | None = None) -> tuple[grpc.Server, int]:
    server, bound, _health = create_server(port, lambda s: None, ["apprentice.v1.Test"], host=host, common=common)
    server.start()
    return server, bound


def test_a_server_without_keys_binds_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_keys(monkeypatch)
    with pytest.raises(InsecureBind, match="APPRENTICE_INSECURE"):
        create_server(0, lambda s: None, ["apprentice.v1.Test"], host="0.0.0.0")
    with pytest.raises(InsecureBind):
        service_host("0.0.0.0")   # metrics and HTTP listeners follow the same rule
    server, port = _bare_server("")
    try:
        assert connects("127.0.0.1", port)
        other = non_loopback_ip()
        if other is not None:
            assert not connects(other, port), f"an unauthenticated server answered on {other}"
    finally:
        server.stop(0)
    monkeypatch.setenv("APPRENTICE_INSECURE", "true")
    server, port = _bare_server("0.0.0.0")
    try:
        other = non_loopback_ip()
        assert connects(other or "127.0.0.1", port)
    finally:
        server.stop(0)


def test_a_server_with_keys_binds_every_interface_by_default(secure_env: DevCredentials) -> None:
    assert service_host("") == "0.0.0.0" and service_host("127.0.0.1") == "127.0.0.1"
    server, port = _bare_server("")
    try:
        assert connects(non_loopback_ip() or "127.0.0.1", port)
    finally:
        server.stop(0)


def test_metrics_bind_the_services_host(secure_env: DevCredentials, monkeypatch: pytest.MonkeyPatch) -> None:
    other = non_loopback_ip()
    if other is None:
        pytest.skip("this host has no address besides loopback")
    port = start_metrics_server(free_port(), service_host("127.0.0.1"))
    assert port is not None and connects("127.0.0.1", port) and not connects(other, port)
    _no_keys(monkeypatch)
    port = start_metrics_server(free_port(), service_host(""))
    assert port is not None and connects("127.0.0.1", port) and not connects(other, port)


def test_a_taken_port_is_port_in_use(secure_env: DevCredentials) -> None:
    server, port = _bare_server("127.0.0.1")
    try:
        with pytest.raises(PortInUse, match=str(port)):
            create_server(port, lambda s: None, ["apprentice.v1.Test"], host="127.0.0.1")
    finally:
        server.stop(0)
    metrics_port = start_metrics_server(free_port(), "127.0.0.1")
    assert metrics_port is not None
    with pytest.raises(PortInUse, match="metrics"):
        start_metrics_server(metrics_port, "127.0.0.1")



def test_an_unknown_caller_sending_garbage_is_unauthenticated_first(secure_stack: SecureStack,
                                                                      targets: dict[str, str]) -> None:
    rpc = next(r for r in ALL_RPCS if r.path == "/apprentice.v1.Weights/Promote")
    assert call_raw(secure_stack.dial.anonymous(targets[rpc.service]), rpc, [GARBAGE[0]]) == C.UNAUTHENTICATED
