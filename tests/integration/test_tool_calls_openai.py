"""Tool calling through the OpenAI door with the unmodified OpenAI SDK on the tiny model (no mocks: the
secured server of tests/integration/test_inference_openai.py and a real broker). tool_choice required /
named are enforced by the grammar, so every returned call's arguments validate against its schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.integration.test_inference_openai import Door, door, ns  # noqa: F401 - the module's fixtures

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER: list[Any] = [{"role": "user", "content": "weather in Paris for 3 days?"}]


def _valid_calls(message: Any) -> list[Any]:
    for c in message.tool_calls or []:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return list(message.tool_calls or [])


def test_required_named_none_and_history(door: Door) -> None:  # noqa: F811 - fixture
    sdk = door.sdk()
    r = sdk.chat.completions.create(model=door.model, messages=USER, tools=TOOLS, tool_choice="required",
                                    max_tokens=80)
    calls = _valid_calls(r.choices[0].message)
    assert calls and r.choices[0].finish_reason in ("tool_calls", "length")
    r = sdk.chat.completions.create(model=door.model, messages=USER, tools=TOOLS, parallel_tool_calls=False,
                                    tool_choice={"type": "function", "function": {"name": "get_time"}},
                                    max_tokens=80)
    calls = _valid_calls(r.choices[0].message)
    assert [c.function.name for c in calls] == ["get_time"]
    assert r.choices[0].message.content is None and r.choices[0].finish_reason == "tool_calls"
    # a history with the call and its result, then tool_choice none: a plain text answer
    history: list[Any] = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function",
         "function": {"name": "get_time", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "12:00"}]
    r = sdk.chat.completions.create(model=door.model, messages=history, tools=TOOLS, tool_choice="none",
                                    max_tokens=8)
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")


def test_bad_tool_requests_are_400(door: Door) -> None:  # noqa: F811 - fixture
    sdk = door.sdk()
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=door.model, messages=USER, tools=TOOLS, max_tokens=4,
                                    tool_choice={"type": "function", "function": {"name": "rm_rf"}})
    assert "not among the tools" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=door.model, max_tokens=4, messages=[
            *USER, {"role": "tool", "tool_call_id": "call_forged", "content": "x"}])
    assert "answers no earlier assistant tool call" in str(e.value)


def test_stream_tool_call_deltas_accumulate_in_the_sdk(door: Door) -> None:  # noqa: F811 - fixture
    """The SDK's own stream helper accumulates the deltas into calls: index, id, type, name, then arguments."""
    sdk = door.sdk()
    with sdk.chat.completions.stream(model=door.model, messages=USER, tools=TOOLS, tool_choice="required",
                                     parallel_tool_calls=False, max_tokens=80) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = _valid_calls(final.choices[0].message)
    assert len(calls) == 1 and final.choices[0].finish_reason == "tool_calls"
    assert not final.choices[0].message.content          # the call's text never streamed as content
    # plain chunks: the first delta of a call names it, the arguments follow
    chunks = list(sdk.chat.completions.create(model=door.model, messages=USER, tools=TOOLS, stream=True,
                                              tool_choice={"type": "function", "function": {"name": "get_time"}},
                                              max_tokens=40))
    deltas = [tc for ch in chunks for c in ch.choices for tc in (c.delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_time"
    args = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(args)["zone"] in ("UTC", "CET")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_langchain_bind_tools_and_structured_output(door: Door) -> None:  # noqa: F811 - fixture
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """Weather request (bounded: the random tiny model would otherwise write strings until max_tokens)."""

        city: str = Field(max_length=12)
        days: int = Field(ge=1, le=7)

    llm = ChatOpenAI(model=door.model, base_url=door.base_url, api_key=door.key(),  # type: ignore[arg-type,call-arg]
                     http_client=__import__("httpx").Client(verify=door.trust), max_tokens=80, max_retries=0)
    msg = llm.bind_tools([Weather], tool_choice="any").invoke("weather in Paris for 3 days?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "Weather"   # type: ignore[attr-defined]
    out = llm.with_structured_output(Weather, method="function_calling").invoke("weather in Paris?")
    assert isinstance(out, Weather)
