"""A served answer --> a Responses API `response` object, whole or as its stream of typed events.

One choice (the Responses API has no `n`) becomes output items: a `message` with one `output_text` part
when the answer holds text, then one `function_call` item per call the answer made (parsed as on the chat
route: shared/decoding/tool_calls.py). Ids derive from the interaction id, so they are unguessable and
the same in the body, the stream and the stored history: the response is `resp_<interaction id>`, its
message `msg_<...>`, a call `fc_<...>` with `call_id` the chat route's `call_<...>` id (the one the
captured Interaction records). The body carries the Apprentice extension (`apprentice.interaction_ids`,
`policy_version`, `session_id`) as chat completions do, so feedback helpers find the interaction.

Status: `completed`, or `incomplete` with `incomplete_details.reason` `max_output_tokens` when the answer
hit its token budget (as OpenAI reports it), or `cancelled` when the call ended first.

Streaming follows OpenAI's event order: `response.created`, `response.in_progress`, per item
`response.output_item.added` ... `response.output_item.done` (text: `content_part.added`,
`output_text.delta`s, `output_text.done`, `content_part.done`; a call: `function_call_arguments.delta`,
`function_call_arguments.done`), then `response.completed` (or `response.incomplete`) with the whole
response. Each SSE frame names its event (`event:`) and every event carries a `sequence_number`. While
tools are offered, text is held back as long as it may still become a call (as on the chat route). An
error after the stream started is an `error` event that also holds an OpenAI `error` object, which the
OpenAI SDKs raise as an APIError.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.inference.engines.base import ChoiceDone, Delta
from services.inference.openai_api import responses as R
from services.inference.openai_api.errors import error_response
from services.inference.openai_api.responses_request import ResponsesRequest
from services.inference.openai_api.streaming import Events, Runner, ToolPlan, consume
from shared.decoding.params import Sample
from shared.decoding.tool_calls import ToolCall, might_be_call, split_answer


def response_id(interaction_id: str) -> str:
    return "resp_" + interaction_id


def _item_id(prefix: str, interaction_id: str, k: int | None = None) -> str:
    raw = interaction_id.partition(".")[0]
    return f"{prefix}_{raw}" if k is None else f"{prefix}_{raw}_{k}"


def status_of(finish_reason: str) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "cancelled":
        return "cancelled", None
    return "completed", None


def usage(served: R.Served, sample: Sample | None) -> dict[str, Any]:
    out = len(sample.token_ids) if sample is not None else 0
    return {"input_tokens": served.prompt_tokens, "input_tokens_details": {"cached_tokens": R.cached_tokens([sample])},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": served.prompt_tokens + out}


def split(sample: Sample, interaction_id: str, plan: ToolPlan) -> tuple[str, list[ToolCall]]:
    """The answer's text and the calls it made (none when no tools were offered)."""
    if not plan.tools or plan.mode == "none":
        return sample.text, []
    content, calls, _ = split_answer(sample.text, sample.finish_reason, plan.tools, plan.mode,
                                     parallel=plan.parallel, id_seed=interaction_id)
    return content, calls


def message_item(interaction_id: str, text: str, status: str = "completed",
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"type": "message", "id": _item_id("msg", interaction_id), "status": status, "role": "assistant",
            "content": [part] if status != "in_progress" else []}


def call_item(interaction_id: str, k: int, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": _item_id("fc", interaction_id, k), "call_id": call.id,
            "name": call.name, "arguments": call.arguments if status != "in_progress" else "", "status": status}


def output_items(interaction_id: str, text: str, calls: Sequence[ToolCall], status: str,
                 logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    item_status = "incomplete" if status == "incomplete" else "completed"
    items = [message_item(interaction_id, text, item_status, logprobs)] if text or not calls else []
    return items + [call_item(interaction_id, k, c) for k, c in enumerate(calls)]


def history_of(text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """The answer as the chat message a continuing response puts in its history."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in calls]
    return msg


def response_object(req: ResponsesRequest, served: R.Served, status: str, output: list[dict[str, Any]],
                    sample: Sample | None, incomplete: dict[str, str] | None = None) -> dict[str, Any]:
    """The `response` object; with `sample` None it is the in-progress one the stream opens with."""
    return {
        "id": response_id(served.ids[0]), "object": "response", "created_at": served.created, "status": status,
        "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "model": served.model, "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "reasoning": None, "store": req.stored,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": req.text or {"format": {"type": "text"}}, "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [], "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_logprobs": req.top_logprobs, "truncation": req.truncation or "disabled",
        "usage": usage(served, sample) if sample is not None else None, "user": req.user,
        "metadata": req.metadata or {}, "apprentice": served.extension,
    }


@dataclass
class Finished:
    """A whole answer, ready to be returned or stored."""

    body: dict[str, Any]
    text: str
    calls: list[ToolCall] = field(default_factory=list)


def finished(req: ResponsesRequest, served: R.Served, sample: Sample, text: str, calls: list[ToolCall],
             tokens: R.TokenText, logprobs: int | None) -> Finished:
    status, incomplete = status_of(sample.finish_reason)
    lps = R.chat_logprobs(sample, tokens, logprobs)["content"] if logprobs is not None else None
    items = output_items(served.ids[0], text, calls, status, lps)
    return Finished(response_object(req, served, status, items, sample, incomplete), text, calls)


# --- streaming ------------------------------------------------------------------------------------------
class EventWriter:
    """Numbers events and frames them as SSE (`event:` + `data:`)."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()


class _TextItem:
    """The message item of a stream, opened on its first text."""

    def __init__(self, ev: EventWriter, interaction_id: str) -> None:
        self.ev, self.iid, self.open, self.text = ev, interaction_id, False, ""
        self.item_id = _item_id("msg", interaction_id)

    def delta(self, piece: str) -> list[bytes]:
        out = []
        if not self.open:
            self.open = True
            out.append(self.ev("response.output_item.added", output_index=0,
                               item=message_item(self.iid, "", "in_progress")))
            out.append(self.ev("response.content_part.added", item_id=self.item_id, output_index=0,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        if piece:
            self.text += piece
            out.append(self.ev("response.output_text.delta", item_id=self.item_id, output_index=0,
                               content_index=0, delta=piece, logprobs=[]))
        return out

    def close(self, item: dict[str, Any]) -> list[bytes]:
        part = item["content"][0]
        return [self.ev("response.output_text.done", item_id=self.item_id, output_index=0, content_index=0,
                        text=part["text"], logprobs=part.get("logprobs", [])),
                self.ev("response.content_part.done", item_id=self.item_id, output_index=0, content_index=0,
                        part=part),
                self.ev("response.output_item.done", output_index=0, item=item)]


async def response_stream(call: Runner, events: Events, req: ResponsesRequest, served: R.Served, plan: ToolPlan,
                          tokens: R.TokenText, logprobs: int | None,
                          on_done: Callable[[Finished], None]) -> AsyncIterator[bytes]:
    ev = EventWriter()
    iid = served.ids[0]
    tooled = bool(plan.tools) and plan.mode != "none"
    held, released = "", not tooled
    text_item = _TextItem(ev, iid)
    try:
        opening = response_object(req, served, "in_progress", [], None)
        yield ev("response.created", response=opening)
        yield ev("response.in_progress", response=opening)
        async for e in consume(call, events):
            if isinstance(e, Delta):
                if not released:
                    held += e.text
                    if might_be_call(held):
                        continue
                    released, piece = True, held
                else:
                    piece = e.text
                for frame in text_item.delta(piece):
                    yield frame
                continue
            assert isinstance(e, ChoiceDone)
            sample = e.sample
            text, calls = split(sample, iid, plan) if not released else (sample.text, [])
            done = finished(req, served, sample, text, calls, tokens, logprobs)
            items = done.body["output"]
            if items and items[0]["type"] == "message":
                for frame in text_item.delta(text if not text_item.text else ""):
                    yield frame
                for frame in text_item.close(items[0]):
                    yield frame
            first_call = 1 if items and items[0]["type"] == "message" else 0
            for k, item in enumerate(items[first_call:], start=first_call):
                yield ev("response.output_item.added", output_index=k, item={**item, "arguments": "",
                                                                             "status": "in_progress"})
                yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=k,
                         delta=item["arguments"])
                yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=k,
                         arguments=item["arguments"])
                yield ev("response.output_item.done", output_index=k, item=item)
            on_done(done)
            status = done.body["status"]
            yield ev(f"response.{status if status in ('incomplete', 'failed') else 'completed'}",
                     response=done.body)
    except Exception as e:  # noqa: BLE001 - the status line is sent; the error goes in the stream
        _, body, _ = error_response(e)
        err = body["error"]
        yield ev("error", code=err["code"], message=err["message"], param=err["param"], error=err)
