"""Python calls --> Apprentice's product-facing gRPC surface (`apprentice.v1.Inference` and `Feedback`).

    from apprentice_client import InferenceClient

    with InferenceClient("127.0.0.1:50051", api_key=KEY, ca_file=".apprentice/secrets/ca.pem") as c:
        r = c.generate([{"role": "user", "content": "hi"}], max_new_tokens=32, temperature=0.7)
        c.feedback(r.choices[0].interaction_id, "thumbs", 1)

Errors surface as `grpc.RpcError` with the server's status code and message (INVALID_ARGUMENT names the
field to fix; UNAVAILABLE and RESOURCE_EXHAUSTED may be retried).

Deadlines: a call without `timeout` (and a client without a default `timeout`) sends no deadline, as
grpcurl and the generated stubs of other languages do; the server then serves it to the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc

from apprentice_client._proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc

TENANT_METADATA = "x-apprentice-tenant"
"""Metadata key naming the tenant of a call (operator and service keys act for any tenant; a backend
key acts for its own only)."""

INFERENCE_SERVICE = "apprentice.v1.Inference"
MAX_MESSAGE_BYTES = 64 << 20
"""The servers' own limit on request and response size."""

MessagesLike = str | Sequence[Mapping[str, str] | tuple[str, str] | common_pb2.ChatMessage]


def to_messages(messages: MessagesLike) -> list[common_pb2.ChatMessage]:
    """A string (one user turn), dicts {"role", "content"}, (role, content) pairs or ChatMessage protos."""
    if isinstance(messages, str):
        return [common_pb2.ChatMessage(role="user", content=messages)]
    out = []
    for m in messages:
        if isinstance(m, common_pb2.ChatMessage):
            out.append(m)
        elif isinstance(m, Mapping):
            out.append(common_pb2.ChatMessage(role=m["role"], content=m["content"]))
        else:
            role, content = m
            out.append(common_pb2.ChatMessage(role=role, content=content))
    return out


def channel_credentials(ca_file: str | Path | None = None, *, tls: bool | None = None,
                        client_cert_file: str | Path | None = None,
                        client_key_file: str | Path | None = None) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for plaintext. TLS is on when `tls` is true or any file is given:
    `ca_file` verifies the server (the system's roots without it), a client certificate and key answer a
    server that requires mutual TLS."""
    if not (tls or ca_file or client_cert_file or client_key_file):
        return None
    if (client_cert_file is None) != (client_key_file is None):
        raise ValueError("give both client_cert_file and client_key_file (mutual TLS), or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca_file).read_bytes() if ca_file else None,
        private_key=Path(client_key_file).read_bytes() if client_key_file else None,
        certificate_chain=Path(client_cert_file).read_bytes() if client_cert_file else None)


class InferenceClient:
    """One channel to an inference server; thread-safe (gRPC channels multiplex concurrent calls)."""

    def __init__(self, target: str, *, api_key: str | None = None, tenant: str | None = None,
                 timeout: float | None = None, ca_file: str | Path | None = None, tls: bool | None = None,
                 client_cert_file: str | Path | None = None, client_key_file: str | Path | None = None,
                 channel: grpc.Channel | None = None, options: Sequence[tuple[str, Any]] = ()) -> None:
        """`target`: host:port. `api_key`: sent as `authorization: Bearer <key>` on every call.
        `tenant`: sent as `x-apprentice-tenant` (a backend key implies its tenant). `timeout`: the default
        deadline of each call in seconds; None = no deadline. `ca_file`/`tls`/`client_*_file`: see
        `channel_credentials`. `channel`: use this channel instead (not closed by `close`)."""
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        if channel is None:
            opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *options]
            creds = channel_credentials(ca_file, tls=tls, client_cert_file=client_cert_file,
                                        client_key_file=client_key_file)
            channel = (grpc.secure_channel(target, creds, options=opts) if creds is not None
                       else grpc.insecure_channel(target, options=opts))
        self.channel = channel
        self._inference = inference_pb2_grpc.InferenceStub(self.channel)
        self._feedback = inference_pb2_grpc.FeedbackStub(self.channel)
        self._metadata: list[tuple[str, str]] = []
        if api_key:
            self._metadata.append(("authorization", f"Bearer {api_key.strip()}"))
        if tenant:
            self._metadata.append((TENANT_METADATA, tenant))

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # --- requests ---------------------------------------------------------------------------------
    @staticmethod
    def request(messages: MessagesLike | None = None, *, prompt: str = "", max_new_tokens: int = 0,
                temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0, stop: Iterable[str] = (),
                seed: int = 0, n: int = 1, session_id: str = "", task: str = "", no_capture: bool = False,
                tenant: str = "", no_knowledge: bool = False) -> inference_pb2.GenerateRequest:
        """Build a GenerateRequest (defaults: server max_new_tokens, greedy, one sample). `no_knowledge`:
        leave the tenant's approved knowledge out of this request's context (to see the weights alone)."""
        return inference_pb2.GenerateRequest(
            messages=to_messages(messages) if messages is not None else [], prompt=prompt,
            sampling=common_pb2.SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                               top_k=top_k, stop=list(stop), seed=seed, n=n),
            tenant=tenant, session_id=session_id, task=task, no_capture=no_capture, no_knowledge=no_knowledge)

    def generate(self, messages: MessagesLike | None = None, *, timeout: float | None = None,
                 **kwargs: Any) -> inference_pb2.GenerateResponse:
        """One unary Generate call; keyword arguments as in `request`. Each choice carries the
        `interaction_id` that feedback refers to."""
        return self._inference.Generate(self.request(messages, **kwargs), timeout=self._deadline(timeout),
                                        metadata=self._metadata)

    def generate_stream(self, messages: MessagesLike | None = None, *, timeout: float | None = None,
                        **kwargs: Any) -> Iterator[inference_pb2.GenerateChunk]:
        """Chunks as they are generated; the last one of each choice has finish_reason, the final one usage.
        Cancel early with `.cancel()` on the returned iterator."""
        return self._inference.GenerateStream(self.request(messages, **kwargs), timeout=self._deadline(timeout),
                                              metadata=self._metadata)

    def feedback(self, interaction_id: str, kind: str, value: float = 0.0, *, comment: str = "",
                 kpi_name: str = "", occurred_at: datetime | None = None, tenant: str = "",
                 timeout: float | None = None) -> inference_pb2.FeedbackAck:
        """Submit thumbs (+1/-1), rating (1-5), correction (comment = corrected answer) or kpi (name, value)
        for an interaction id from a response. `occurred_at` (naive = UTC; default: when the server receives
        it) is when the user acted: the grader joins feedback that arrives within its window of the
        interaction, and a retry with the same `occurred_at` is recognised as a repeat."""
        req = inference_pb2.FeedbackRequest(interaction_id=interaction_id, kind=kind, value=value, comment=comment,
                                            kpi_name=kpi_name, tenant=tenant)
        if occurred_at is not None:
            when = occurred_at if occurred_at.tzinfo else occurred_at.replace(tzinfo=timezone.utc)
            req.occurred_at.FromDatetime(when)
        return self._feedback.Submit(req, timeout=self._deadline(timeout), metadata=self._metadata)

    # --- plumbing ---------------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server reports SERVING (model loaded); raises TimeoutError."""
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=_health_request, response_deserializer=_health_status)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check(INFERENCE_SERVICE, timeout=2.0, metadata=self._metadata) == _SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"inference at {self.target} not SERVING within {timeout:.0f}s")

    def close(self) -> None:
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The standard health check (grpc.health.v1) has two one-field messages; encoding them here saves a
# dependency on grpcio-health-checking. HealthCheckRequest{service = 1: string};
# HealthCheckResponse{status = 1: enum}, SERVING = 1.
_SERVING = 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _health_request(service: str) -> bytes:
    name = service.encode()
    return b"\x0a" + _varint(len(name)) + name


def _health_status(data: bytes) -> int:
    """The `status` field of a HealthCheckResponse (0 = UNKNOWN when absent)."""
    i, status = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if field == 1:
                status = value
        elif wire == 2:
            length, i = _read_varint(data, i)
            i += length
        else:                     # fixed32/64: not in this message; skip safely
            i += 4 if wire == 5 else 8
    return status


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
