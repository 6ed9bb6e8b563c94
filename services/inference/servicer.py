"""gRPC `apprentice.v1.Inference` and `apprentice.v1.Feedback` --> the app's request steps (calls.py).

The servicers only translate: protobuf requests to the app's request steps, the app's samples and stream
events back to protobuf, and every call into the request metrics (`observed`). What a call does lives in
the app, shared with the OpenAI-compatible HTTP API (openai_api/).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from services.inference import metrics
from services.inference.calls import Calls
from services.inference.engines.base import ChoiceDone, Delta
from services.inference.requests import PreparedRequest
from shared.decoding.tool_calls import ToolCall, might_be_call, split_answer
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from shared.rpc.grpc_util import ServiceError, grpc_errors

F = TypeVar("F", bound=Callable[..., Any])


def _code_of(e: BaseException) -> str:
    if isinstance(e, ServiceError):
        return e.code.name
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        return e.code().name
    return "INTERNAL"


def observed(method: str) -> Callable[[F], F]:
    """Count calls by status code and time them (unary and server-streaming handlers)."""
    def wrap(fn: F) -> F:
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(self: Any, request: Any, context: Any) -> Any:
                t0, code = time.perf_counter(), "OK"
                try:
                    yield from fn(self, request, context)
                except BaseException as e:
                    code = "CANCELLED" if isinstance(e, GeneratorExit) else _code_of(e)
                    raise
                finally:
                    metrics.REQUESTS.labels(method=method, code=code).inc()
                    metrics.LATENCY.labels(method=method).observe(time.perf_counter() - t0)
            return gen  # type: ignore[return-value]

        @functools.wraps(fn)
        def unary(self: Any, request: Any, context: Any) -> Any:
            t0, code = time.perf_counter(), "OK"
            try:
                return fn(self, request, context)
            except BaseException as e:
                code = _code_of(e)
                raise
            finally:
                metrics.REQUESTS.labels(method=method, code=code).inc()
                metrics.LATENCY.labels(method=method).observe(time.perf_counter() - t0)
        return unary  # type: ignore[return-value]
    return wrap


def _usage(p: PreparedRequest, samples: list[Any]) -> inference_pb2.Usage:
    completion = sum(len(s.token_ids) for s in samples)
    return inference_pb2.Usage(prompt_tokens=len(p.prompt_ids), completion_tokens=completion,
                               total_tokens=len(p.prompt_ids) + completion)


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, app: Calls) -> None:
        self.app = app

    @grpc_errors
    @observed("Generate")
    def Generate(self, request: inference_pb2.GenerateRequest, context: Any) -> inference_pb2.GenerateResponse:
        t0 = time.perf_counter()
        p = self.app.prepare(request, context)
        c = self.app.complete(p, context, t0)
        choices = []
        for i, (s, iid) in enumerate(zip(c.samples, c.ids, strict=True)):
            text, calls, finish = split_answer(s.text, s.finish_reason, p.tools, p.tool_choice,
                                               parallel=p.parallel_tool_calls, id_seed=iid)
            choices.append(inference_pb2.Choice(
                interaction_id=iid, text=text, finish_reason=finish, token_count=len(s.token_ids), index=i,
                tool_calls=[common_pb2.ToolCall(id=t.id, name=t.name, arguments=t.arguments) for t in calls]))
        return inference_pb2.GenerateResponse(
            choices=choices,
            policy_version=c.version, usage=_usage(p, c.samples), session_id=p.session_id)

    @grpc_errors
    @observed("GenerateStream")
    def GenerateStream(self, request: inference_pb2.GenerateRequest, context: Any) -> Iterator[inference_pb2.GenerateChunk]:
        t0 = time.perf_counter()
        p = self.app.prepare(request, context)
        version, ids, events = self.app.stream(p, context, t0)
        n = p.sampling.n
        samples: dict[int, Any] = {}
        # with tools, a choice's text is held back while it may still be a call (shared/decoding/tool_calls.py
        # might_be_call); calls come whole on the choice's last chunk, content never carries their text
        tooled = bool(p.tools) and p.tool_choice != "none"
        held: dict[int, str] = {}
        released: set[int] = set()
        with contextlib.closing(events):      # closed early (client gone): the generation is cancelled
            for ev in events:
                if isinstance(ev, Delta):
                    text = ev.text
                    if tooled and ev.index not in released:
                        held[ev.index] = held.get(ev.index, "") + text
                        if might_be_call(held[ev.index]):
                            text = ""
                        else:
                            text = held.pop(ev.index)
                            released.add(ev.index)
                    yield inference_pb2.GenerateChunk(index=ev.index, interaction_id=ids[ev.index], text=text,
                                                      token_ids=ev.token_ids, policy_version=version,
                                                      session_id=p.session_id)
                elif isinstance(ev, ChoiceDone):
                    samples[ev.index] = ev.sample
                    calls: list[ToolCall] = []
                    rest, finish = ev.sample.text, ev.sample.finish_reason
                    if tooled and ev.index not in released:
                        rest, calls, finish = split_answer(ev.sample.text, finish, p.tools, p.tool_choice,
                                                           parallel=p.parallel_tool_calls, id_seed=ids[ev.index])
                    else:
                        rest = ""
                    chunk = inference_pb2.GenerateChunk(
                        index=ev.index, interaction_id=ids[ev.index], finish_reason=finish, text=rest,
                        policy_version=version, session_id=p.session_id,
                        tool_calls=[common_pb2.ToolCall(id=t.id, name=t.name, arguments=t.arguments)
                                    for t in calls])
                    if len(samples) == n:
                        chunk.usage.CopyFrom(_usage(p, [samples[i] for i in range(n)]))
                    yield chunk


class FeedbackServicer(inference_pb2_grpc.FeedbackServicer):
    def __init__(self, app: Calls) -> None:
        self.app = app

    @grpc_errors
    @observed("Feedback.Submit")
    def Submit(self, request: inference_pb2.FeedbackRequest, context: Any) -> inference_pb2.FeedbackAck:
        return self.app.submit_feedback(request, context)
