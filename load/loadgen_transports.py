"""One load-generator call --> the inference service over gRPC or its OpenAI-compatible HTTP API.

Both transports answer the same two questions (generate, feedback) and fail the same way: `CallError`
with a gRPC status name, so the load generator's retry rules and error counts do not depend on the
protocol. HTTP statuses map back to the names the HTTP API derived them from (400 -> INVALID_ARGUMENT,
429 -> RESOURCE_EXHAUSTED, ...); a connection that cannot be opened is UNAVAILABLE, a client time-out
DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import ssl
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import grpc

from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from shared.security.channels import TokenSource, open_channel
from shared.settings import CommonSettings

PROTOCOLS = ("grpc", "openai")
DEFAULT_TARGETS = {"grpc": "127.0.0.1:50051", "openai": "127.0.0.1:8000"}

# A restarted server is found again within a second (gRPC's default reconnect back-off grows to 2 min).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 1000)]

HTTP_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT",
              429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
              504: "DEADLINE_EXCEEDED"}


class CallError(Exception):
    """A call that failed; `code` is a gRPC status name (the HTTP status mapped to one)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code


@dataclass(frozen=True)
class Answer:
    version: str
    interaction_ids: list[str]
    text: str
    """The first choice's text."""


@dataclass(frozen=True)
class Ack:
    accepted: bool
    event_id: str


class Transport(ABC):
    """How the load generator reaches the inference service; thread-safe."""

    @abstractmethod
    def generate(self, messages: list[dict[str, str]], *, tenant: str, session_id: str, task: str,
                 max_new_tokens: int, timeout: float, wait: bool) -> Answer:
        """One Generate (temperature 0.7, top-p 0.95). `wait`: wait for a server that is not up yet."""

    @abstractmethod
    def feedback(self, *, interaction_id: str, tenant: str, kind: str, value: float, kpi_name: str,
                 occurred_at: datetime, timeout: float, wait: bool) -> Ack:
        """One Feedback submission."""

    @abstractmethod
    def close(self) -> None: ...


class GrpcTransport(Transport):
    def __init__(self, target: str, common: CommonSettings | None) -> None:
        self.channel = open_channel(target, common, options=CHANNEL_OPTIONS)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.feedback_stub = inference_pb2_grpc.FeedbackStub(self.channel)

    def generate(self, messages: list[dict[str, str]], *, tenant: str, session_id: str, task: str,
                 max_new_tokens: int, timeout: float, wait: bool) -> Answer:
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages],
            sampling=common_pb2.SamplingParams(max_new_tokens=max_new_tokens, temperature=0.7, top_p=0.95),
            tenant=tenant, session_id=session_id, task=task)
        try:
            r = self.inference.Generate(req, timeout=timeout, wait_for_ready=wait)
        except grpc.RpcError as e:
            raise CallError(e.code().name, e.details() or "") from None
        return Answer(r.policy_version, [c.interaction_id for c in r.choices], r.choices[0].text if r.choices else "")

    def feedback(self, *, interaction_id: str, tenant: str, kind: str, value: float, kpi_name: str,
                 occurred_at: datetime, timeout: float, wait: bool) -> Ack:
        req = inference_pb2.FeedbackRequest(interaction_id=interaction_id, kind=kind, value=value,
                                            kpi_name=kpi_name, tenant=tenant)
        req.occurred_at.FromDatetime(occurred_at)
        try:
            ack = self.feedback_stub.Submit(req, timeout=timeout, wait_for_ready=wait)
        except grpc.RpcError as e:
            raise CallError(e.code().name, e.details() or "") from None
        return Ack(ack.accepted, ack.event_id)

    def close(self) -> None:
        self.channel.close()


class OpenAITransport(Transport):
    """POST /v1/chat/completions and /v1/feedback (the Apprentice extension) with httpx. The interaction
    ids come from the `apprentice` extension of the body; the tenant travels in the body's `tenant`
    extension (a backend key implies its own)."""

    def __init__(self, target: str, common: CommonSettings | None, *, max_connections: int) -> None:
        import httpx  # only this protocol needs it

        common = common or CommonSettings()
        self.base_url = base_url(target, tls=common.tls_ca is not None)
        self._token = TokenSource.from_settings(common)
        verify: Any = True
        if common.tls_ca is not None or common.tls_client_cert is not None:
            verify = ssl.create_default_context(cafile=str(common.tls_ca) if common.tls_ca else None)
            if common.tls_client_cert is not None and common.tls_client_key is not None:   # mutual TLS
                verify.load_cert_chain(str(common.tls_client_cert), str(common.tls_client_key))
        self._httpx = httpx
        self.http = httpx.Client(base_url=self.base_url, verify=verify,
                                 limits=httpx.Limits(max_connections=max_connections,
                                                     max_keepalive_connections=max_connections))

    def _post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        token = self._token()
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            r = self.http.post(path, json=body, headers=headers, timeout=timeout)
        except self._httpx.TimeoutException as e:
            raise CallError("DEADLINE_EXCEEDED", str(e)) from None
        except self._httpx.TransportError as e:
            raise CallError("UNAVAILABLE", str(e)) from None
        if r.status_code != 200:
            raise CallError(HTTP_CODES.get(r.status_code, "INTERNAL"), f"HTTP {r.status_code}: {r.text[:300]}")
        data: dict[str, Any] = r.json()
        return data

    def generate(self, messages: list[dict[str, str]], *, tenant: str, session_id: str, task: str,
                 max_new_tokens: int, timeout: float, wait: bool) -> Answer:
        body = {"model": "", "messages": messages, "max_tokens": max_new_tokens, "temperature": 0.7,
                "top_p": 0.95, "tenant": tenant, "session_id": session_id, "task": task}
        data = self._post("/chat/completions", body, timeout)
        ext = data.get("apprentice") or {}
        choices = data.get("choices") or [{}]
        return Answer(ext.get("policy_version", data.get("system_fingerprint", "")),
                      list(ext.get("interaction_ids") or [data.get("id", "")]),
                      (choices[0].get("message") or {}).get("content") or "")

    def feedback(self, *, interaction_id: str, tenant: str, kind: str, value: float, kpi_name: str,
                 occurred_at: datetime, timeout: float, wait: bool) -> Ack:
        body = {"interaction_id": interaction_id, "kind": kind, "value": value, "kpi_name": kpi_name,
                "tenant": tenant, "occurred_at": occurred_at.isoformat().replace("+00:00", "Z")}
        data = self._post("/feedback", body, timeout)
        return Ack(bool(data.get("accepted")), str(data.get("event_id", "")))

    def close(self) -> None:
        self.http.close()


def base_url(target: str, *, tls: bool) -> str:
    """`host:port` or a URL --> the API's base URL (`.../v1`); https when a CA is configured."""
    url = target if "://" in target else f"{'https' if tls else 'http'}://{target}"
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def make_transport(protocol: str, target: str, common: CommonSettings | None, *,
                   max_connections: int = 64) -> Transport:
    if protocol == "grpc":
        return GrpcTransport(target, common)
    if protocol == "openai":
        return OpenAITransport(target, common, max_connections=max_connections)
    raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
