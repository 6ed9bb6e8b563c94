"""Tool calling over gRPC Generate / GenerateStream on the tiny model, no mocks: a real inference server
(tests/helpers/inference.py) and broker. tool_choice required / named are enforced by the grammar
(shared/decoding/tool_calls.py tool_grammar, enforced by shared/decoding/constraints.py), so even the
random tiny model must answer with calls whose arguments validate against the tool's schema."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import jsonschema
import pytest

from services.inference.client import InferenceClient
from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from shared.proto.apprentice.v1 import common_pb2, events_pb2, inference_pb2
from tests.helpers.inference import start_inference
from tests.helpers.kafka import collect

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
WEATHER = common_pb2.Tool(name="get_weather", description="Weather forecast", parameters_json=json.dumps(SCHEMA))
TIME = common_pb2.Tool(name="get_time", parameters_json=json.dumps(
    {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
     "additionalProperties": False}))


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    t = Topics(prefix=f"test-tools-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, t)
    yield t
    with contextlib.suppress(Exception):
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()])


@pytest.fixture(scope="module")
def client(ns: Topics, kafka_bootstrap: str, tiny_model_name: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    a = start_inference(tmp_path_factory.mktemp("inference"), model=tiny_model_name, bootstrap=kafka_bootstrap,
                        topic_prefix=ns.prefix, follow_updates=False, heartbeat_interval_s=0)
    with InferenceClient(f"127.0.0.1:{a.port}", tenant="acme") as c:
        yield c
    a.stop(2)


def _req(client: InferenceClient, **kw: Any) -> inference_pb2.GenerateRequest:
    req = client.request([{"role": "user", "content": "weather in Paris for 3 days?"}], max_new_tokens=80)
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(req, k).extend(v)
        elif isinstance(v, bool):
            setattr(req, k, v)
        else:
            getattr(req, k).CopyFrom(v)
    return req


def _schemas() -> dict[str, Any]:
    return {t.name: json.loads(t.parameters_json) for t in (WEATHER, TIME)}


def test_required_and_named_calls_validate(client: InferenceClient) -> None:
    r = client._inference.Generate(_req(client, tools=[WEATHER, TIME],
                                        tool_choice=common_pb2.ToolChoice(mode="required")), timeout=120)
    c = r.choices[0]
    assert c.finish_reason in ("tool_calls", "length") and len(c.tool_calls) >= 1, c
    for call in c.tool_calls:
        assert call.id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), _schemas()[call.name])
    r = client._inference.Generate(_req(client, tools=[WEATHER, TIME], no_parallel_tool_calls=True,
                                        tool_choice=common_pb2.ToolChoice(mode="function", function="get_time")),
                                   timeout=120)
    calls = r.choices[0].tool_calls
    assert [c.name for c in calls] == ["get_time"] and json.loads(calls[0].arguments)["zone"] in ("UTC", "CET")


def test_stream_sends_whole_calls_on_the_last_chunk(client: InferenceClient) -> None:
    chunks = list(client._inference.GenerateStream(_req(client, tools=[WEATHER],
                                                        tool_choice=common_pb2.ToolChoice(mode="required")),
                                                   timeout=120))
    assert "".join(ch.text for ch in chunks) == "", [(ch.text, ch.finish_reason, list(ch.tool_calls)) for ch in chunks if ch.text or ch.finish_reason]   # the call's text is never streamed as content
    last = chunks[-1]
    assert last.finish_reason in ("tool_calls", "length") and last.tool_calls
    jsonschema.validate(json.loads(last.tool_calls[0].arguments), SCHEMA)


def test_bad_tools_are_invalid_argument(client: InferenceClient) -> None:
    with pytest.raises(grpc.RpcError) as e:
        client._inference.Generate(_req(client, tools=[WEATHER], tool_choice=common_pb2.ToolChoice(
            mode="function", function="rm_rf")), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not among the tools" in (e.value.details() or "")


def test_capture_holds_the_tools_and_the_calls_the_caller_got(client: InferenceClient, ns: Topics,
                                                              kafka_bootstrap: str) -> None:
    call = common_pb2.ToolCall(id="call_1", name="get_time", arguments='{"zone": "UTC"}')
    req = _req(client, tools=[WEATHER, TIME], tool_choice=common_pb2.ToolChoice(mode="required"),
               no_parallel_tool_calls=True)
    req.messages.extend([common_pb2.ChatMessage(role="assistant", tool_calls=[call]),
                         common_pb2.ChatMessage(role="tool", tool_call_id="call_1", content="12:00")])
    c = client._inference.Generate(req, timeout=120).choices[0]
    got = collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[c.interaction_id])
    ev = next(e for e in got if e.interaction_id == c.interaction_id)
    assert [t.name for t in ev.tools] == ["get_weather", "get_time"]
    assert [(t.id, t.name, t.arguments) for t in ev.response_tool_calls] == [
        (t.id, t.name, t.arguments) for t in c.tool_calls]
    assert ev.messages[1].tool_calls[0].id == "call_1" and ev.messages[2].tool_call_id == "call_1"
