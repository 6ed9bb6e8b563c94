"""One gRPC target over several replicas (`replica_target`): TLS verifies against the replicas' name, and a
call moves to the next replica when the first one goes, as a product backend's channel must."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.rpc.grpc_util import create_server, set_serving
from shared.security.channels import open_channel, replica_target, with_authority
from shared.settings import CommonSettings
from tools.devca import ensure_dev_credentials


def test_a_single_address_is_left_alone() -> None:
    assert replica_target(["127.0.0.1:5"]) == "127.0.0.1:5"
    assert with_authority("127.0.0.1:5", [("x", 1)]) == [("x", 1)]


def test_an_address_list_names_its_first_host_as_the_authority() -> None:
    target = replica_target(["127.0.0.1:5", "127.0.0.1:6"])
    assert target == "ipv4:127.0.0.1:5,127.0.0.1:6"
    assert with_authority(target) == [("grpc.default_authority", "127.0.0.1")]
    mine = [("grpc.default_authority", "weights.internal")]
    assert with_authority(target, mine) == mine


def test_a_tls_call_fails_over_to_the_next_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = ensure_dev_credentials(tmp_path, ("t",))
    for name, value in creds.service_env().items():
        monkeypatch.setenv(name, value)
    servers = []
    for _ in range(2):
        server, port, health = create_server(0, lambda _srv: None, ["replica"], host="127.0.0.1")
        server.start()
        set_serving(health, ["replica"])
        servers.append((server, port))
    client = CommonSettings().model_copy(update={"tls_ca": creds.ca, "auth_token_file": creds.operator_token})
    try:
        with open_channel(replica_target([f"127.0.0.1:{p}" for _, p in servers]), client) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            ok = health_pb2.HealthCheckResponse.SERVING
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == ok
            servers[0][0].stop(0).wait()            # the replica the channel picked first goes
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10, wait_for_ready=True).status == ok
    finally:
        for server, _ in servers:
            server.stop(0)
