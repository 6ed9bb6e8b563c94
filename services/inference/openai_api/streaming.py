"""Engine events (`Delta`, `ChoiceDone`) --> OpenAI stream chunks --> server-sent events.

Chunks follow OpenAI's order: per choice a first chunk with the assistant role (chat), content deltas,
a last chunk with `finish_reason` (and the choice's log-probs when asked); then, with
`stream_options.include_usage`, one chunk with empty `choices` and the usage; then `data: [DONE]`.
An error after the stream started (the engine failed, the server is stopping) is sent as
`data: {"error": {...}}`, which the OpenAI SDKs raise as an APIError, and the stream ends.

The engine's events are read on a worker thread, one at a time (`Call.run`); a client that goes away
ends the call, which cancels its generation (`SSEResponse`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, NamedTuple, Protocol

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.inference.engines.base import ChoiceDone, Delta
from services.inference.openai_api import responses as R
from services.inference.openai_api.errors import error_response
from shared.decoding.tool_calls import ToolCall, ToolSpec, might_be_call, split_answer

Events = Generator[Delta | ChoiceDone, None, None]
"""What `InferenceApp.stream` returns: closing it early cancels the generation."""

DONE = b"data: [DONE]\n\n"
_END = object()


class Runner(Protocol):
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on a worker thread as the call's caller."""


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def consume(call: Runner, events: Events) -> AsyncIterator[Delta | ChoiceDone]:
    try:
        while (ev := await call.run(next, events, _END)) is not _END:
            yield ev
    finally:
        events.close()     # not exhausted (client gone, error): the generation is cancelled


class ToolPlan(NamedTuple):
    """The request's tools (services/inference/requests.py PreparedRequest): what a choice may call."""

    tools: list[ToolSpec]
    mode: str
    parallel: bool


def _tool_call_deltas(index: int, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """OpenAI's streamed calls: per call, a delta with index, id, type and name (arguments ""), then one
    with its arguments (how the OpenAI SDKs and LangChain accumulate them)."""
    out = []
    for k, c in enumerate(calls):
        head = {"index": k, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
        out.append({"index": index, "delta": {"tool_calls": [head]}, "logprobs": None, "finish_reason": None})
        out.append({"index": index, "delta": {"tool_calls": [{"index": k, "function": {"arguments": c.arguments}}]},
                    "logprobs": None, "finish_reason": None})
    return out


async def chat_stream(call: Runner, events: Events, served: R.Served, n: int,
                      text: R.TokenText, logprobs: int | None, include_usage: bool, *,
                      tools: ToolPlan | None = None) -> AsyncIterator[bytes]:
    done: dict[int, Any] = {}
    # with tools, a choice's text is held back while it may still be a call (shared/decoding/tool_calls.py)
    tooled = tools is not None and bool(tools.tools) and tools.mode != "none"
    held: dict[int, str] = {}
    released: set[int] = set()
    try:
        yield sse(R.chat_chunk(served, [R.chat_delta(i, role=True, content="") for i in range(n)], first=True))
        async for ev in consume(call, events):
            if isinstance(ev, Delta):
                piece = ev.text
                if tooled and ev.index not in released:
                    held[ev.index] = held.get(ev.index, "") + piece
                    if might_be_call(held[ev.index]):
                        continue
                    piece = held.pop(ev.index)
                    released.add(ev.index)
                if piece:
                    yield sse(R.chat_chunk(served, [R.chat_delta(ev.index, content=piece)]))
            else:
                done[ev.index] = ev.sample
                finish = ev.sample.finish_reason
                if tools is not None and tooled and ev.index not in released:
                    content, calls, finish = split_answer(ev.sample.text, finish, tools.tools, tools.mode,
                                                          parallel=tools.parallel, id_seed=served.ids[ev.index])
                    held.pop(ev.index, None)
                    if content:
                        yield sse(R.chat_chunk(served, [R.chat_delta(ev.index, content=content)]))
                    for delta in _tool_call_deltas(ev.index, calls):
                        yield sse(R.chat_chunk(served, [delta]))
                lp = None if logprobs is None else R.chat_logprobs(ev.sample, text, logprobs)
                yield sse(R.chat_chunk(served, [R.chat_delta(ev.index, finish=finish, logprobs=lp)]))
    except Exception as e:  # noqa: BLE001 - the status line is sent; the error goes in the stream
        yield sse(error_response(e)[1])
        return
    if include_usage:
        yield sse(R.chat_chunk(served, [], usage=served.usage([done[i] for i in sorted(done)])))
    yield DONE


async def text_stream(call: Runner, events: Events, served: R.Served, n: int,
                      text: R.TokenText, logprobs: int | None, include_usage: bool) -> AsyncIterator[bytes]:
    done: dict[int, Any] = {}
    first = True
    try:
        async for ev in consume(call, events):
            if isinstance(ev, Delta):
                if ev.text:
                    yield sse(R.text_chunk(served, [R.text_delta(ev.index, ev.text)], first=first))
                    first = False
            else:
                done[ev.index] = ev.sample
                lp = None if logprobs is None else R.completion_logprobs(ev.sample, text, logprobs)
                yield sse(R.text_chunk(served, [R.text_delta(ev.index, "", finish=ev.sample.finish_reason,
                                                             logprobs=lp)], first=first))
                first = False
    except Exception as e:  # noqa: BLE001
        yield sse(error_response(e)[1])
        return
    if include_usage:
        yield sse(R.text_chunk(served, [], usage=served.usage([done[i] for i in sorted(done)])))
    yield DONE


class SSEResponse(StreamingResponse):
    """A text/event-stream response that runs `on_disconnect` as soon as the client goes away (the
    generation stops then, not when the next chunk fails to send)."""

    def __init__(self, content: AsyncIterator[bytes], headers: dict[str, str],
                 on_disconnect: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                await self.listen_for_disconnect(receive)
                self.on_disconnect()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await self.stream_response(send)
            except OSError:
                self.on_disconnect()
            tg.cancel_scope.cancel()


async def watch_disconnect(receive: Receive, on_disconnect: Callable[[], None],
                           work: Callable[[], Awaitable[Any]]) -> Any:
    """`await work()` while watching the connection: a client that goes away runs `on_disconnect`
    (which cancels the generation the work waits for). A bare asyncio task, not a task group: this
    runs on every request, and a task group costs ~10x more (uvicorn serves on asyncio)."""
    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        on_disconnect()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work()
    finally:
        watcher.cancel()
