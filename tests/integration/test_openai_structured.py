"""Structured output through the front door (issue #34, H1): the unmodified OpenAI SDK and LangChain against
the real inference server (tiny random model, real broker). The random model never writes JSON by itself,
so every answer that validates against its schema was shaped by the grammar mask
(shared/decoding/constraints.py); bad schemas are HTTP 400 with llguidance's message and param
response_format; the constraint is captured on the Interaction."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field, SecretStr

from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import collect
from tests.integration.test_inference_openai import MESSAGES, Door, door, ns  # noqa: F401 - module fixtures

pytestmark = pytest.mark.integration

NAME = {"type": "string", "maxLength": 12}
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120}},
                 "required": ["name", "age"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "enum_array": {"type": "object", "properties": {
        "label": {"enum": ["bug", "feature", "question"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["label", "tags"], "additionalProperties": False},
    "anyof_numbers": {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5}, {"type": "boolean"}]},
        "ok": {"type": "boolean"}},
        "required": ["value", "ok"], "additionalProperties": False},
}


def _rf(name: str, schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_strict_answers_validate(door: Door, name: str) -> None:  # noqa: F811
    schema = SCHEMAS[name]
    r = door.sdk().chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=120, n=2,
                                           temperature=1.0, seed=7, response_format=_rf(name, schema))
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content or ""), schema)


def test_json_object_and_streaming(door: Door, kafka_bootstrap: str, ns: Topics) -> None:  # noqa: F811
    client = door.sdk()
    # any object is a valid json_object answer, and the random model wanders inside an open object (greedy
    # never closes it); seed 6 is one of the seeds whose draw closes it within the budget
    r = client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=120, seed=6,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    schema = SCHEMAS["enum_array"]
    parts, finish = [], None
    stream = client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=120, stream=True,
                                            response_format=_rf("s", schema))
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads("".join(parts)), schema)
    got = collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[r.id])
    e = next(x for x in got if x.interaction_id == r.id)
    assert e.response_format.type == "json_object"


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip: int = Field(ge=0, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=10)
    role: Literal["admin", "user"]
    addresses: list[Address] = Field(max_length=2)


def test_sdk_parse_with_a_pydantic_model(door: Door) -> None:  # noqa: F811
    r = door.sdk().chat.completions.parse(model=door.model, messages=MESSAGES, max_tokens=200,
                                          response_format=Person)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Person)
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), Person.model_json_schema())


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_langchain_with_structured_output(door: Door, method: str) -> None:  # noqa: F811
    import httpx

    llm = ChatOpenAI(model=door.model, base_url=door.base_url, api_key=SecretStr(door.key()), max_retries=0,  # type: ignore[call-arg]
                     max_tokens=300, temperature=1.0, seed=6, http_client=httpx.Client(verify=door.trust))
    if method == "json_schema":
        out = llm.with_structured_output(Person, method="json_schema", strict=True).invoke(
            "Give me a person as JSON.")
        assert isinstance(out, Person)
    else:   # json_mode: any JSON object; the caller's parser reads it
        raw = llm.with_structured_output(None, method="json_mode").invoke("Give me JSON.")  # type: ignore[arg-type]
        assert isinstance(raw, dict)


@pytest.mark.parametrize("rf, fragment", [
    (_rf("bad", {"type": "objectx"}), "objectx"),
    (_rf("arr", {"type": "array"}), "object schema"),
    ({"type": "xml"}, "response_format"),
    (_rf("huge", {"type": "object", "description": "x" * 70000}), "larger than"),
])
def test_bad_schemas_are_400_naming_response_format(door: Door, rf: Any, fragment: str) -> None:  # noqa: F811
    with pytest.raises(openai.BadRequestError) as e:
        door.sdk().chat.completions.create(model=door.model, messages=MESSAGES, response_format=rf)
    body: Any = e.value.body
    assert body["param"] == "response_format"
    assert fragment in body["message"]
