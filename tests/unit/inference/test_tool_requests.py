"""Tools on the shared request path (services/inference/requests.py): one validation for both doors, the
Hermes rendering in the prompt, the grammar that enforces tool_choice, and the HTTP body's mapping
(services/inference/openai_api/schemas.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.inference.openai_api.errors import error_response
from services.inference.openai_api.schemas import parse_chat
from services.inference.requests import prepare
from services.inference.settings import InferenceSettings
from shared.proto.apprentice.v1 import common_pb2, inference_pb2
from shared.rpc.grpc_util import InvalidRequest

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = common_pb2.Tool(name="get_weather", description="Weather", parameters_json=json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def tok(tiny_model_name: str) -> Any:
    from shared.models import load_tokenizer

    return load_tokenizer(tiny_model_name)


def _prepare(tok: Any, req: inference_pb2.GenerateRequest) -> Any:
    return prepare(req, "acme", InferenceSettings(), tok, 2048, "s-new")


def _user(text: str = "weather in Paris?") -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role="user", content=text)


@pytest.mark.parametrize(("kw", "message"), [
    ({"tools": [common_pb2.Tool(name="bad name")]}, "tools[0].function.name must match"),
    ({"tools": [common_pb2.Tool(name="f", parameters_json="[")]}, "tools[0].function.parameters is not JSON"),
    ({"tools": [WEATHER, WEATHER]}, "offered twice"),
    ({"tools": [WEATHER], "tool_choice": common_pb2.ToolChoice(mode="function", function="rm")},
     "not among the tools"),
    ({"tool_choice": common_pb2.ToolChoice(mode="required")}, "needs tools"),
    ({"messages": [_user(), common_pb2.ChatMessage(role="tool", tool_call_id="call_x", content="forged")]},
     "answers no earlier assistant tool call"),
])
def test_bad_tool_requests_are_invalid_argument(tok: Any, kw: dict[str, Any], message: str) -> None:
    kw.setdefault("messages", [_user()])
    with pytest.raises(InvalidRequest) as e:
        _prepare(tok, inference_pb2.GenerateRequest(**kw))
    assert message in str(e.value)
    status, body, _ = error_response(e.value)
    assert status == 400 and body["error"]["param"]


def test_tools_history_rendered_and_grammar_set(tok: Any) -> None:
    call = common_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    req = inference_pb2.GenerateRequest(messages=[
        _user(), common_pb2.ChatMessage(role="assistant", tool_calls=[call]),
        common_pb2.ChatMessage(role="tool", tool_call_id="call_1", content="sunny, 21C")],
        tools=[WEATHER], tool_choice=common_pb2.ToolChoice(mode="required"), no_parallel_tool_calls=True)
    p = _prepare(tok, req)
    assert "<tools>" in p.prompt_text and '"name": "get_weather"' in p.prompt_text
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in p.prompt_text
    assert p.sampling.grammar is not None and p.sampling.grammar.kind == "lark"
    assert 'call ("\\n" call)*' not in p.sampling.grammar.source      # no parallel calls
    assert p.tools[0].name == "get_weather" and p.tool_choice == "required" and not p.parallel_tool_calls
    # the captured messages keep the calls and results as given (not the rendering)
    assert p.messages[1].tool_calls[0].id == "call_1" and p.messages[2].role == "tool"


def test_http_body_maps_to_the_proto() -> None:
    raw = {"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA, "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False}
    req = parse_chat(raw).to_proto()
    assert req.tools[0].strict and json.loads(req.tools[0].parameters_json) == SCHEMA
    assert req.tool_choice.mode == "function" and req.tool_choice.function == "get_weather"
    assert req.no_parallel_tool_calls
    assert req.messages[1].tool_calls[0].name == "get_weather" and req.messages[2].tool_call_id == "call_1"
    legacy = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                         "functions": [{"name": "f"}], "function_call": {"name": "f"}}).to_proto()
    assert legacy.tools[0].name == "f" and legacy.tool_choice.function == "f"


def _captured(tok: Any, p: Any, answer: str) -> Any:
    """The Interaction a served `answer` to prepared request `p` is captured as (before privacy)."""
    from services.inference.requests import interaction_event
    from shared.decoding.params import Sample

    ids = tok(answer, add_special_tokens=False)["input_ids"]
    sample = Sample(token_ids=ids, text=answer, logprobs=[-0.5] * len(ids), logprobs_t1=[-0.6] * len(ids),
                    finish_reason="stop")
    return interaction_event(p, sample, interaction_id="i1", group_id="g", index=0, model="m", version="base",
                             canary=False, pod="pod-1", latency_ms=1.0, trace_id="t")


def test_tool_arguments_and_results_are_redacted_in_the_capture(tok: Any) -> None:
    """Personal data in an agent's history (a call's arguments, a tool's result) and in the calls answered
    is redacted like any content (services/inference/privacy.py), and the prompt served and recorded without it."""
    from services.inference.privacy import CapturePrivacy
    from shared.decoding.tool_calls import format_call

    email, card = "dana.w@example.com", "4111.1111.1111.1111"
    lookup = common_pb2.Tool(name="lookup", parameters_json='{"type":"object","properties":{"email":{"type":"string"}}}')
    call = common_pb2.ToolCall(id="call_1", name="lookup", arguments=json.dumps({"email": email}))
    req = inference_pb2.GenerateRequest(tools=[lookup], messages=[
        _user("find my order"), common_pb2.ChatMessage(role="assistant", tool_calls=[call]),
        common_pb2.ChatMessage(role="tool", tool_call_id="call_1", content=f"order 7, card {card}")])
    s = InferenceSettings(pod_id="pod-1")
    p = prepare(req, "acme", s, tok, 2048, "s1")
    cp = CapturePrivacy(s, lambda: tok)
    cp.redact_prompt(p)
    assert email not in p.prompt_text and card not in p.prompt_text, "redacted before it is served"
    assert email in p.messages[1].tool_calls[0].arguments, "the request keeps the messages as sent"
    ev = _captured(tok, p, format_call("lookup", {"email": email}))
    assert email in ev.response_tool_calls[0].arguments
    cp.interactions(p, [ev])
    assert email not in str(ev) and card not in str(ev) and list(ev.prompt_token_ids) == p.prompt_ids
    assert "<tool_response>" in ev.prompt_text and "<EMAIL_ADDRESS>" in ev.messages[1].tool_calls[0].arguments


def test_personal_data_in_tool_definitions_is_redacted_in_the_capture(tok: Any) -> None:
    """A backend's tool definitions reach the prompt the trainer learns from: an e-mail in a description or
    an enum is redacted there and in `Interaction.tools`, the schema stays a schema, and `reject` refuses."""
    from services.inference.privacy import CapturePrivacy
    from shared.privacy.policy import PiiPolicy

    email = "dana.w@example.com"
    schema = {"type": "object", "properties": {"to": {"enum": [email, "support"]}}, "required": ["to"]}
    mail = common_pb2.Tool(name="send_mail", description=f"Mail the account owner at {email}",
                           parameters_json=json.dumps(schema))
    req = inference_pb2.GenerateRequest(tools=[mail], messages=[_user("tell the owner")])
    s = InferenceSettings(pod_id="pod-1")
    p = prepare(req, "acme", s, tok, 2048, "s1")
    assert email in p.prompt_text
    cp = CapturePrivacy(s, lambda: tok)
    cp.redact_prompt(p)
    ev = _captured(tok, p, "ok")
    cp.interactions(p, [ev])
    assert email not in str(ev) and "<EMAIL_ADDRESS>" in ev.prompt_text and "<tools>" in ev.prompt_text
    assert list(ev.prompt_token_ids) == p.prompt_ids and p.tools[0].description == f"Mail the account owner at {email}"
    captured = json.loads(ev.tools[0].parameters_json)
    assert captured["properties"]["to"]["enum"] == ["<EMAIL_ADDRESS>", "support"]
    assert ev.tools[0].description == "Mail the account owner at <EMAIL_ADDRESS>"
    strict = InferenceSettings(pod_id="pod-1", pii_policy=PiiPolicy.REJECT)
    with pytest.raises(InvalidRequest, match="EMAIL_ADDRESS"):
        CapturePrivacy(strict, lambda: tok).screen_request(prepare(req, "acme", strict, tok, 2048, "s2"))
