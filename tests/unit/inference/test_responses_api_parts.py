"""The Responses API's network-free parts: a body --> the chat request it is served as, the stored
responses (bounds, tenants, age), and the error mapping to `input`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from services.inference.openai_api.errors import BadRequest, error_response
from services.inference.openai_api.response_store import (
    PreviousResponseNotFound,
    ResponseStore,
    StoredResponse,
)
from services.inference.openai_api.responses_request import in_input_terms, items_to_messages, parse_responses
from shared.rpc.grpc_util import InvalidRequest

CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
        "arguments": '{"city": "Oslo"}', "status": "completed"}


def test_an_answer_and_its_calls_become_one_assistant_turn() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        CALL, {**CALL, "call_id": "call_b"},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "reasoning", "summary": []},
    ]
    got = items_to_messages(items)
    assert [m["role"] for m in got] == ["user", "assistant", "tool", "tool"]
    assert got[1]["content"] == "Let me look." and [c["id"] for c in got[1]["tool_calls"]] == ["call_a", "call_b"]
    assert got[3] == {"role": "tool", "tool_call_id": "call_b", "content": "rain"}
    # a call with no text before it opens its own assistant turn
    assert items_to_messages([{"role": "user", "content": "x"}, CALL])[1]["content"] == ""


def test_a_body_is_served_as_the_equivalent_chat_request() -> None:
    req = parse_responses({
        "model": "m", "instructions": "Be brief.", "input": "hi", "max_output_tokens": 7, "temperature": 0.2,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
        "include": ["message.output_text.logprobs"], "top_logprobs": 3, "session_id": "s-1"})
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "earlier"}]
    chat = req.to_chat(history, session_id="s-0")
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user"]
    proto = chat.to_proto()
    assert proto.sampling.max_new_tokens == 7 and proto.session_id == "s-1"      # the body's own session wins
    assert proto.tool_choice.mode == "function" and proto.tool_choice.function == "f"
    assert proto.no_parallel_tool_calls and proto.tools[0].strict
    assert proto.response_format.type == "json_schema" and proto.response_format.strict
    assert chat.logprobs and chat.top_logprobs == 3
    assert parse_responses({"input": "x"}).to_chat([], "s-0").to_proto().session_id == "s-0"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "include": ["code_interpreter_call.outputs"]}, "include"),
    ({"input": ""}, "input"),
])
def test_what_is_not_served_is_a_400_naming_its_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_responses(body).to_chat([])
    assert e.value.param == param


def test_a_chat_message_error_is_reported_about_input() -> None:
    e = in_input_terms(InvalidRequest("messages[2].content is empty"))
    status, body, _ = error_response(e)
    assert status == 400 and body["error"]["param"] == "input" and "messages[2].content is empty" in str(e)
    other = InvalidRequest("sampling.top_p must be in (0, 1]")
    assert in_input_terms(other) is other


def _item(tenant: str = "acme", text: str = "x") -> StoredResponse:
    return StoredResponse(tenant, "s", [{"role": "user", "content": text}], {"id": "r"})


def test_the_store_finds_a_response_only_for_its_tenant_and_forgets_the_oldest() -> None:
    store = ResponseStore(max_responses=2)
    store.put("r1", _item())
    store.put("r2", _item())
    assert store.get("r1", "acme").tenant == "acme"          # r1 is now the most recently used
    with pytest.raises(PreviousResponseNotFound) as e:
        store.get("r1", "globex")
    assert error_response(e.value)[0] == 404 and error_response(e.value)[1]["error"]["code"] == \
        "previous_response_not_found"
    store.put("r3", _item())                                 # over the count: the least recently used (r2) goes
    assert len(store) == 2
    with pytest.raises(PreviousResponseNotFound):
        store.get("r2", "acme")
    store.delete("r3", "acme")
    assert len(store) == 1


def test_the_store_bounds_characters_and_age() -> None:
    store = ResponseStore(max_chars=_item(text="a" * 100).chars * 2 + 10)
    for k in range(5):
        store.put(f"r{k}", _item(text="a" * 100))
    assert len(store) == 2                                   # only what fits the character bound stays
    store.put("huge", _item(text="a" * 10_000))              # larger than the whole store: not kept
    with pytest.raises(PreviousResponseNotFound):
        store.get("huge", "acme")
    aged = ResponseStore(ttl_s=0.01)
    aged.put("r", _item())
    time.sleep(0.02)
    with pytest.raises(PreviousResponseNotFound):
        aged.get("r", "acme")
