"""A small typed client for the Inference and Feedback services (extractor, grader's LLM judge, demo, load).

    with InferenceClient("127.0.0.1:50051", tenant="acme") as c:
        r = c.generate([{"role": "user", "content": "hi"}], max_new_tokens=32, temperature=0.7)
        c.feedback(r.choices[0].interaction_id, "thumbs", 1)

Errors surface as `grpc.RpcError` with the server's status code and message.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import grpc

from shared.events import timestamp
from shared.grpc_util import TENANT_METADATA
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc

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


class InferenceClient:
    def __init__(self, target: str, *, api_key: str | None = None, tenant: str | None = None,
                 timeout: float = 120.0, channel: grpc.Channel | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        self.channel = channel or grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])
        self._inference = inference_pb2_grpc.InferenceStub(self.channel)
        self._feedback = inference_pb2_grpc.FeedbackStub(self.channel)
        self._metadata: list[tuple[str, str]] = []
        if api_key:
            self._metadata.append(("authorization", f"Bearer {api_key}"))
        if tenant:
            self._metadata.append((TENANT_METADATA, tenant))

    # --- requests ---------------------------------------------------------------------------------
    @staticmethod
    def request(messages: MessagesLike | None = None, *, prompt: str = "", max_new_tokens: int = 0,
                temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0, stop: Iterable[str] = (),
                seed: int = 0, n: int = 1, session_id: str = "", task: str = "", no_capture: bool = False,
                tenant: str = "") -> inference_pb2.GenerateRequest:
        """Build a GenerateRequest (defaults: server max_new_tokens, greedy, one sample)."""
        return inference_pb2.GenerateRequest(
            messages=to_messages(messages) if messages is not None else [], prompt=prompt,
            sampling=common_pb2.SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                               top_k=top_k, stop=list(stop), seed=seed, n=n),
            tenant=tenant, session_id=session_id, task=task, no_capture=no_capture)

    def generate(self, messages: MessagesLike | None = None, *, timeout: float | None = None,
                 **kwargs: Any) -> inference_pb2.GenerateResponse:
        """One unary Generate call; keyword arguments as in `request`."""
        return self._inference.Generate(self.request(messages, **kwargs), timeout=timeout or self.timeout,
                                        metadata=self._metadata)

    def generate_text(self, messages: MessagesLike | None = None, **kwargs: Any) -> str:
        """The first choice's text (convenience for judges and extractors)."""
        return self.generate(messages, **kwargs).choices[0].text

    def generate_stream(self, messages: MessagesLike | None = None, *, timeout: float | None = None,
                        **kwargs: Any) -> Iterator[inference_pb2.GenerateChunk]:
        """Chunks as they are generated; the last one of each choice has finish_reason, the final one usage."""
        return self._inference.GenerateStream(self.request(messages, **kwargs), timeout=timeout or self.timeout,
                                              metadata=self._metadata)

    def feedback(self, interaction_id: str, kind: str, value: float = 0.0, *, comment: str = "",
                 kpi_name: str = "", occurred_at: datetime | None = None, tenant: str = "",
                 timeout: float | None = None) -> inference_pb2.FeedbackAck:
        """Submit thumbs (+1/-1), rating (1-5), correction (comment = corrected answer) or kpi (name, value)."""
        req = inference_pb2.FeedbackRequest(interaction_id=interaction_id, kind=kind, value=value, comment=comment,
                                            kpi_name=kpi_name, tenant=tenant)
        if occurred_at is not None:
            req.occurred_at.CopyFrom(timestamp(occurred_at))
        return self._feedback.Submit(req, timeout=timeout or self.timeout, metadata=self._metadata)

    # --- plumbing ---------------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server reports SERVING (model loaded); raises TimeoutError."""
        import time

        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service="apprentice.v1.Inference"), timeout=2.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
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
