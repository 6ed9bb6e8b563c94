"""Agent traffic on the real SmolLM2-135M-Instruct (slow: minutes on 2 cores; `make test-all`), through the
secured OpenAI door with the unmodified clients: the OpenAI SDK's forced tool call, LangChain's `bind_tools`
and `with_structured_output`, `responses.parse`, and the OpenAI Agents SDK's default Responses model
running an agent with a tool and a typed output. Every schema-constrained answer must parse against its
schema: on a real model the grammar, not luck, is what makes that hold."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field, SecretStr

from shared.contracts.topics import Topics
from shared.models import SMOLLM2
from tests.integration.test_inference_openai import Door, ns, open_door  # noqa: F401 - the module's fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}


class Forecast(BaseModel):
    """A forecast the user asked for."""

    city: str = Field(max_length=24)
    days: int = Field(ge=1, le=7)


@pytest.fixture(scope="module")
def smol(ns: Topics, kafka_bootstrap: str,  # noqa: F811 - fixture
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    with open_door(ns, kafka_bootstrap, SMOLLM2, tmp_path_factory) as d:
        yield d


def test_forced_tool_call_and_langchain_bind_tools(smol: Door) -> None:
    r = smol.sdk().chat.completions.create(
        model=smol.model, max_tokens=60, temperature=0.0,
        messages=[{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                                  "parameters": WEATHER}}], tool_choice="required",
        parallel_tool_calls=False)   # allowed more, SmolLM2 repeats its (correct) call until the budget cuts one
    calls: list[Any] = list(r.choices[0].message.tool_calls or [])
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for c in calls:
        assert c.function.name == "get_weather"
        jsonschema.validate(json.loads(c.function.arguments), WEATHER)
    print("SmolLM2 forced call:", [c.function.arguments for c in calls])

    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, days: int) -> str:
        """Weather forecast for a city over some days."""
        return "sunny"

    llm = ChatOpenAI(model=smol.model, base_url=smol.base_url, api_key=SecretStr(smol.key()), max_retries=0,  # type: ignore[call-arg]
                     max_tokens=60, temperature=0.0, http_client=httpx.Client(verify=smol.trust))
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Oslo for 2 days?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
    assert isinstance(msg.tool_calls[0]["args"]["city"], str) and isinstance(msg.tool_calls[0]["args"]["days"], int)
    out = llm.with_structured_output(Forecast, method="json_schema", strict=True).invoke(
        "Forecast for Rome, 4 days, as JSON.")
    assert isinstance(out, Forecast)
    print("SmolLM2 bind_tools:", msg.tool_calls[0]["args"], "with_structured_output:", out)


def test_responses_parse_and_an_agents_sdk_agent(smol: Door) -> None:
    r = smol.sdk().responses.parse(model=smol.model, input="Forecast for Lisbon, 5 days.", text_format=Forecast,
                                   max_output_tokens=60, temperature=0.0)
    assert r.status == "completed" and isinstance(r.output_parsed, Forecast)
    jsonschema.validate(json.loads(r.output_text), Forecast.model_json_schema())

    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

    ran: list[tuple[str, int]] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=24)], days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """Weather forecast for a city over some days."""
        ran.append((city, days))
        return f"{city}: sunny for {days} days"

    client: Any = __import__("openai").AsyncOpenAI(base_url=smol.base_url, api_key=smol.key(), max_retries=0,
                                                   http_client=httpx.AsyncClient(verify=smol.trust))
    agent = Agent(name="forecaster", instructions="Look up the weather, then answer.", tools=[get_weather],
                  output_type=Forecast, model=OpenAIResponsesModel(model=smol.model, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=80,
                                               temperature=0.0))
    from agents.exceptions import MaxTurnsExceeded

    try:
        result = asyncio.run(Runner.run(agent, "What's the weather in Madrid for 2 days?", max_turns=4,
                                        run_config=RunConfig(tracing_disabled=True)))
        final: Any = result.final_output
    except MaxTurnsExceeded:
        final = None
    print("SmolLM2 agent: tool ran with", ran, "final", final)
    # the forced first call is always made, with arguments the tool's schema accepts (or the SDK would have
    # refused to run it); after it, tool_choice is auto and the answer is the typed output or another call
    assert ran and all(isinstance(c, str) and 1 <= d <= 7 for c, d in ran)
    assert final is None or isinstance(final, Forecast)
