"""`/v1/responses` with the unmodified OpenAI SDK and the OpenAI Agents SDK (its default Responses model) on
the tiny model, against the secured server of tests/integration/test_inference_openai.py and a real broker.

What a backend relies on: text answers with the interaction id for feedback, the typed stream the SDKs
accumulate, function calls whose arguments validate against their schema (tool_choice required is
enforced by the grammar), function_call_output items and previous_response_id continuing one captured
session, structured output through `responses.parse`, and precise 400/404s for what is not served."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import httpx
import jsonschema
import openai
import pytest
from apprentice_client import interaction_id_of, session_id_of
from pydantic import BaseModel, Field

from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import collect
from tests.integration.test_inference_openai import Door, door, ns  # noqa: F401 - the module's fixtures

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Forecast", "parameters": SCHEMA,
                     "strict": True}]


def test_text_answer_feedback_and_stored_response(door: Door) -> None:  # noqa: F811 - fixture
    sdk = door.sdk()
    r = sdk.responses.create(model=door.model, instructions="Be brief.", input="hello there",
                             max_output_tokens=6, temperature=0.0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
    assert r.output_text == getattr(r.output[0].content[0], "text", None)
    if r.status == "incomplete":
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens <= 6 and r.usage.input_tokens > 0
    iid = interaction_id_of(r)
    assert r.id == "resp_" + iid and session_id_of(r)
    ack = door.http(door.key()).post("/feedback", json={"interaction_id": iid, "kind": "thumbs", "value": 1})
    assert ack.status_code == 200, ack.text
    # stored: retrievable by the tenant it was served to, invisible to another, deletable
    assert sdk.responses.retrieve(r.id).output_text == r.output_text
    with pytest.raises(openai.NotFoundError):
        door.sdk("globex").responses.retrieve(r.id)
    sdk.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(r.id)


def test_stream_events_in_order_and_final_response(door: Door) -> None:  # noqa: F811 - fixture
    sdk = door.sdk()
    events: list[Any] = list(sdk.responses.create(model=door.model, input="count to five", max_output_tokens=8,
                                                  stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and "response.output_item.done" in kinds
    # the SDK's stream helper accumulates the events into the final response (it wants `response.completed`:
    # a forced call closes within its budget, where the tiny model's free text would not)
    with sdk.responses.stream(model=door.model, input="weather?", tools=TOOLS, tool_choice="required",
                              parallel_tool_calls=False, max_output_tokens=80) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.status == "completed" and final.output[-1].type == "function_call"
    jsonschema.validate(json.loads(final.output[-1].arguments), SCHEMA)


def test_function_call_then_its_output_continues_the_session(door: Door, ns: Topics,  # noqa: F811 - fixtures
                                                              kafka_bootstrap: str) -> None:
    sdk = door.sdk()
    r = sdk.responses.create(model=door.model, input="weather in Paris for 3 days?", tools=TOOLS,
                             tool_choice="required", parallel_tool_calls=False, max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)
    # continue from the stored response: only the call's output is sent
    r2 = sdk.responses.create(model=door.model, previous_response_id=r.id, tools=TOOLS, tool_choice="none",
                              input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                      "output": "sunny, 21C"}], max_output_tokens=6)
    assert r2.previous_response_id == r.id and r2.output[0].type == "message"
    assert session_id_of(r2) == session_id_of(r)
    # ... or the whole history as input items, as the Agents SDK sends it: the same session id makes one trajectory
    history: list[Any] = [{"role": "user", "content": "weather in Paris for 3 days?"},
                          calls[0].model_dump(exclude_none=True),
                          {"type": "function_call_output", "call_id": calls[0].call_id, "output": "x"}]
    r3 = sdk.responses.create(model=door.model, tools=TOOLS, max_output_tokens=6, tool_choice="none", input=history,
                              extra_body={"session_id": session_id_of(r)})
    assert r3.status in ("completed", "incomplete")
    ids = [interaction_id_of(x) for x in (r, r2, r3)]
    got = {e.interaction_id: e for e in collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=ids)}
    assert len({got[i].session_id for i in ids}) == 1              # (captured pseudonymised, but one session)
    assert got[ids[1]].messages[-1].role == "tool"          # the tool result is in the captured prompt
    # the stream of a forced call: the arguments arrive as function_call_arguments events
    events = list(sdk.responses.create(model=door.model, input="weather?", tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_output_tokens=80, stream=True))
    args = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(args) == 1 and not [e for e in events if e.type == "response.output_text.delta"]
    jsonschema.validate(json.loads(args[0].arguments), SCHEMA)


class Forecast(BaseModel):
    city: str = Field(max_length=12)       # bounded, so the tiny model's random text closes within the budget
    days: int = Field(ge=1, le=7)


def test_structured_output_parses_against_its_schema(door: Door) -> None:  # noqa: F811 - fixture
    r = door.sdk().responses.parse(model=door.model, input="weather in Paris?", text_format=Forecast,
                                   max_output_tokens=60)
    assert r.status == "completed" and isinstance(r.output_parsed, Forecast)
    jsonschema.validate(json.loads(r.output_text), Forecast.model_json_schema())


def test_unknown_foreign_and_unsupported_are_precise_errors(door: Door) -> None:  # noqa: F811 - fixture
    sdk = door.sdk()
    r = sdk.responses.create(model=door.model, input="hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError) as e:
        door.sdk("globex").responses.create(model=door.model, input="go on", previous_response_id=r.id,
                                            max_output_tokens=2)
    assert e.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model=door.model, input="go on", previous_response_id="resp_nope", max_output_tokens=2)
    unstored = sdk.responses.create(model=door.model, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "call_forged", "output": "x"}]}, "input"),
        ({"truncation": "auto"}, "truncation"),
        ({"background": True}, "background"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input": [{"role": "user", "content": "x"}] * 4097}, "input"),
        ({"temperature": "hot"}, "temperature"),
    ]
    with door.http(door.key()) as http:
        for extra, param in bad:
            body = {"model": door.model, "input": "hi", "max_output_tokens": 2, **extra}
            got = http.post("/responses", json=body)
            assert got.status_code == 400, (extra, got.text)
            assert got.json()["error"]["param"] == param, (extra, got.text)
        assert http.post("/responses", json=[1]).status_code == 400
        nan = http.post("/responses", content=b'{"input": "hi", "temperature": NaN}',
                        headers={"content-type": "application/json"})
        assert nan.status_code == 400, nan.text
        # a backend key acts for its own tenant only: naming another one, in the body or the query, is refused
        assert http.post("/responses", json={"model": door.model, "input": "hi", "max_output_tokens": 2,
                                             "tenant": "globex"}).status_code == 403
        assert http.get(f"/responses/{r.id}", params={"tenant": "globex"}).status_code == 403
    with door.http() as anonymous:                      # no credentials
        assert anonymous.post("/responses", json={"input": "hi"}).status_code == 401
        assert anonymous.get(f"/responses/{r.id}").status_code == 401
        assert anonymous.delete(f"/responses/{r.id}").status_code == 401
    assert sdk.responses.retrieve(r.id).id == r.id       # none of that touched the stored response


def test_the_agents_sdk_runs_an_agent_with_a_tool(door: Door) -> None:  # noqa: F811 - fixture
    """The Agents SDK's default model is the Responses one: a forced first call, the tool runs in the
    agent, its output goes back as a function_call_output item, and the agent finishes with its typed
    output (structured output bounds the tiny model's answer; free text would run to the budget)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

    ran: list[tuple[str, int]] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=12)], days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """Forecast for a city."""
        ran.append((city, days))
        return "sunny"

    client = openai.AsyncOpenAI(base_url=door.base_url, api_key=door.key(), max_retries=0,
                                http_client=httpx.AsyncClient(verify=door.trust))  # type: ignore[arg-type]
    agent = Agent(name="forecaster", instructions="Answer with the forecast.", tools=[get_weather], output_type=Forecast,
                  model=OpenAIResponsesModel(model=door.model, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=80, temperature=0.0))
    config = RunConfig(tracing_disabled=True)

    async def both() -> tuple[Any, Any, list[Any]]:     # one event loop: the client's connections live on it
        result = await Runner.run(agent, "weather in Paris?", max_turns=4, run_config=config)
        run = Runner.run_streamed(agent, "weather in Oslo?", max_turns=4, run_config=config)
        seen = [e.type async for e in run.stream_events()]
        return result, run.final_output, seen

    result, streamed, seen = asyncio.run(both())
    assert len(ran) == 2 and isinstance(result.final_output, Forecast) and isinstance(streamed, Forecast)
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"
    assert "raw_response_event" in seen and "run_item_stream_event" in seen
