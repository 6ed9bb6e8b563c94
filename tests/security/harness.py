"""A secured deployment for tests: development credentials --> environment --> servers --> channels that
dial them as each kind of caller.

Importable by every security test (`from tests.security.harness import ...`); the fixtures built on it
live in `tests/security/conftest.py`.

- `secure_environment(creds)`: the variables that turn authentication, TLS and signed interaction ids
  on for every server started in the process (what `apprentice up` sets for its services);
- `Dialer`: channels through `shared.security.channels.open_channel` (the one way Apprentice dials) as
  the operator, a service, a tenant's backend, an anonymous caller, an unknown key, a client that
  trusts another CA, a plaintext client, or a client presenting a certificate (mutual TLS);
- `call_raw`: call any method with raw request bytes, whatever its streaming shape, and return the
  status code (the auth and garbage-bytes tests call every RPC this way);
- `start_knowledge`: the real Knowledge server on loopback (the Weights server is
  `tests/helpers/weights.py`, waiting is `tests/helpers/waiting.py`).
"""

from __future__ import annotations

import secrets
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from shared.proto.apprentice.v1 import inference_pb2, knowledge_pb2, weights_pb2
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from tools.devca import DevCredentials, ensure_dev_credentials, issue_cert, make_ca

TENANT_A = "acme"
TENANT_B = "globex"
TENANTS = (TENANT_A, TENANT_B, "demo", "default")

SECURITY_VARS = (
    "APPRENTICE_AUTH_KEYS", "APPRENTICE_AUTH_KEYS_FILE", "APPRENTICE_AUTH_TOKEN", "APPRENTICE_AUTH_TOKEN_FILE",
    "APPRENTICE_TLS_CERT", "APPRENTICE_TLS_KEY", "APPRENTICE_TLS_CA", "APPRENTICE_TLS_CLIENT_AUTH",
    "APPRENTICE_TLS_CLIENT_CERT", "APPRENTICE_TLS_CLIENT_KEY", "APPRENTICE_INSECURE",
    "APPRENTICE_INTERACTION_ID_SECRET", "APPRENTICE_INTERACTION_ID_SECRET_FILE",
    "APPRENTICE_INFERENCE_API_KEYS",
)
"""Every variable that changes how a server admits callers: cleared before a test sets its own."""


def make_credentials(home: Path) -> DevCredentials:
    """The development CA, server certificate, keys file (operator, services, one backend per tenant in
    TENANTS) and interaction-id secret under `<home>/secrets/`."""
    return ensure_dev_credentials(home, tenants=TENANTS)


def secure_environment(creds: DevCredentials) -> dict[str, str]:
    """Servers started with these variables authenticate every call against the keys file, listen with
    TLS only, sign interaction ids, and present the service key when they dial another service."""
    return creds.service_env()


# --- channels ------------------------------------------------------------------------------------
@dataclass
class Dialer:
    """Opens channels to secured servers as each kind of caller; `close()` closes them all."""

    creds: DevCredentials
    channels: list[grpc.Channel] = field(default_factory=list)

    def _open(self, target: str, token: str, **tls: Any) -> grpc.Channel:
        # Every TLS setting explicit: the test's environment (a server's) must not leak into the client.
        settings: dict[str, Any] = dict(tls_ca=None, tls_client_cert=None, tls_client_key=None)
        settings.update(tls)
        common = CommonSettings(auth_token=SecretStr(""), auth_token_file=None, **settings)
        ch = open_channel(target, common, token=token, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.channels.append(ch)
        return ch

    def _verified(self, target: str, token: str) -> grpc.Channel:
        return self._open(target, token, tls_ca=self.creds.ca)

    def operator(self, target: str) -> grpc.Channel:
        return self._verified(target, self.creds.token(self.creds.operator_token))

    def service(self, target: str) -> grpc.Channel:
        return self._verified(target, self.creds.token(self.creds.service_token))

    def backend(self, target: str, tenant: str = TENANT_A) -> grpc.Channel:
        return self._verified(target, self.creds.token(self.creds.backend_token(tenant)))

    def anonymous(self, target: str) -> grpc.Channel:
        """TLS (the server is verified) but no key."""
        return self._verified(target, "")

    def unknown_key(self, target: str) -> grpc.Channel:
        """TLS and a well-formed key that no server knows."""
        return self._verified(target, secrets.token_urlsafe(32))

    def with_token(self, target: str, token: str) -> grpc.Channel:
        return self._verified(target, token)

    def wrong_ca(self, target: str, directory: Path) -> grpc.Channel:
        """A client that trusts another CA (created under `directory`), presenting the operator's key."""
        other_ca, _ = make_ca(directory, name="Some other CA")
        return self._open(target, self.creds.token(self.creds.operator_token), tls_ca=other_ca)

    def plaintext(self, target: str) -> grpc.Channel:
        """No TLS at all, presenting the operator's key (which must never travel in clear to a TLS port)."""
        return self._open(target, self.creds.token(self.creds.operator_token))

    def client_cert(self, target: str, common_name: str, *, token: str = "",
                    ca_directory: Path | None = None) -> grpc.Channel:
        """Mutual TLS with a client certificate named `common_name`, signed by the development CA (or by
        a CA created under `ca_directory`)."""
        if ca_directory is None:
            ca_pem, ca_key = self.creds.ca, self.creds.directory / "ca.key"
        else:
            ca_pem, ca_key = make_ca(ca_directory, name="Rogue CA")
        prefix = (ca_directory or self.creds.directory) / f"client-{common_name}"
        cert, key = issue_cert(ca_pem, ca_key, prefix, common_name, server=False)
        return self._open(target, token, tls_ca=self.creds.ca, tls_client_cert=cert, tls_client_key=key)

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.channels.clear()


# --- calls ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rpc:
    """One method of one service, as the descriptors describe it."""

    path: str                    # "/apprentice.v1.Weights/Promote"
    request_type: type[Any]
    client_streaming: bool
    server_streaming: bool

    @property
    def service(self) -> str:
        return self.path.split("/")[1]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def rpcs_of(*modules: Any) -> list[Rpc]:
    """Every RPC declared in the given generated `*_pb2` modules."""
    from google.protobuf import message_factory

    out: list[Rpc] = []
    for mod in modules:
        for service in mod.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out.append(Rpc(f"/{service.full_name}/{m.name}", message_factory.GetMessageClass(m.input_type),
                               m.client_streaming, m.server_streaming))
    return out


INFERENCE_RPCS = rpcs_of(inference_pb2)
KNOWLEDGE_RPCS = rpcs_of(knowledge_pb2)
WEIGHTS_RPCS = rpcs_of(weights_pb2)


def call_raw(channel: grpc.Channel, rpc: Rpc, payloads: list[bytes], *, timeout: float = 20.0,
             metadata: list[tuple[str, str]] | None = None) -> grpc.StatusCode:
    """Send raw request bytes (one message, or several for a client stream) and drain the answer;
    returns the final status code."""
    kw: dict[str, Any] = dict(request_serializer=None, response_deserializer=None)
    try:
        if rpc.client_streaming and rpc.server_streaming:
            for _ in channel.stream_stream(rpc.path, **kw)(iter(payloads), timeout=timeout, metadata=metadata):
                pass
        elif rpc.client_streaming:
            channel.stream_unary(rpc.path, **kw)(iter(payloads), timeout=timeout, metadata=metadata)
        elif rpc.server_streaming:
            for _ in channel.unary_stream(rpc.path, **kw)(payloads[0], timeout=timeout, metadata=metadata):
                pass
        else:
            channel.unary_unary(rpc.path, **kw)(payloads[0], timeout=timeout, metadata=metadata)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def rpc_error(fn: Callable[[], Any]) -> grpc.RpcError:
    """The error `fn` raised; fails the test when it succeeded."""
    try:
        fn()
    except grpc.RpcError as e:
        return e
    raise AssertionError("the call succeeded; it must have been refused")


def code_of(fn: Callable[[], Any]) -> grpc.StatusCode:
    """OK, or the status code of the error `fn` raised."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def health(channel: grpc.Channel, service: str = "", timeout: float = 10.0) -> int:
    """The health status the server reports for `service` (health is public: no key needed)."""
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


SERVING = health_pb2.HealthCheckResponse.SERVING


def non_loopback_ip() -> str | None:
    """An address of this host that is not loopback (the route to a public address), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))   # no packet is sent: this only picks the outgoing interface
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def connects(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --- servers -------------------------------------------------------------------------------------
def start_knowledge(model_name: str, *, consume: bool = False, **overrides: Any) -> Any:
    """The real extractor (Knowledge gRPC server on loopback port 0) with the tiny model; needs the topic
    namespace of the environment. Returns the started `ExtractorApp` (`.port`, `.store`, `.stop()`)."""
    from services.extractor.curation import approx_tokens
    from services.extractor.llm_local import LocalLLM
    from services.extractor.service import ExtractorApp
    from services.extractor.settings import ExtractorSettings

    kw: dict[str, Any] = dict(port=0, host="127.0.0.1", metrics_port=0, session_gap_s=0.0,
                              group_id=f"extractor-{uuid.uuid4().hex[:6]}", max_new_tokens=8, grace_s=1.0)
    kw.update(overrides)
    app = ExtractorApp(ExtractorSettings(**kw), LocalLLM(model_name), count_tokens=approx_tokens)
    app.start(consume=consume)
    return app

