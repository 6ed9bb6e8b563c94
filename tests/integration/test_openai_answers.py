"""Agents through the front door, small gaps (issue #34, item 6), with the unmodified client libraries against
the real inference server (tiny model, real broker, keys and TLS on): an over-long prompt is OpenAI's
`context_length_exceeded`; the interaction id reaches a LangChain stream through the response headers; the
light client's `interaction_id_of` / `feedback` turn any answer form into a feedback event on the topic.
"""

from __future__ import annotations

import math

import grpc
import httpx
import openai
import pytest
from apprentice_client import feedback, interaction_id_of, session_id_of
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionTokenLogprob
from pydantic import SecretStr

from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import collect
from tests.integration.test_inference_openai import MESSAGES, Door, door, ns  # noqa: F401 - module fixtures

pytestmark = pytest.mark.integration
LONG = "hi " * 2100
"""More tokens than the tiny model's 2048-token context window."""


def test_over_long_prompts_are_context_length_exceeded(door: Door) -> None:  # noqa: F811
    client = door.sdk()
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=door.model, messages=[{"role": "user", "content": LONG}])
    assert chat.value.code == "context_length_exceeded" and chat.value.param == "messages"
    assert chat.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as text:
        client.completions.create(model=door.model, prompt=LONG, stream=True)
    assert text.value.code == "context_length_exceeded" and text.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as room:
        client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=2047)
    assert room.value.code == "context_length_exceeded"
    with door.grpc() as g, pytest.raises(grpc.RpcError) as rpc:
        g.generate([{"role": "user", "content": LONG}])
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT                       # type: ignore[attr-defined]
    assert "context length exceeded" in (rpc.value.details() or "")                  # type: ignore[attr-defined]


def test_ids_in_headers_whole_and_streamed(door: Door) -> None:  # noqa: F811
    client = door.sdk()
    raw = client.chat.completions.with_raw_response.create(
        model=door.model, messages=MESSAGES, n=2, temperature=0.8, max_tokens=4, user="sess é/1")
    r = raw.parse()
    assert [interaction_id_of(raw, i) for i in (0, 1)] == [interaction_id_of(r, i) for i in (0, 1)]
    assert interaction_id_of(raw) == r.id and session_id_of(raw) == session_id_of(r) == "sess é/1"
    with client.chat.completions.with_streaming_response.create(
            model=door.model, messages=MESSAGES, max_tokens=4, stream=True, user="s2") as resp:
        header_ids = resp.headers["x-apprentice-interaction-ids"].split(",")
        chunks = list(resp.parse())
    assert session_id_of(resp) == "s2"
    assert {interaction_id_of(c) for c in chunks} == set(header_ids)            # every chunk: the choice's id
    text = client.completions.with_raw_response.create(model=door.model, prompt="hi", max_tokens=3)
    assert interaction_id_of(text) == text.parse().id and session_id_of(text)


def _lc(d: Door) -> ChatOpenAI:
    return ChatOpenAI(model=d.model, base_url=d.base_url, api_key=SecretStr(d.key()), max_retries=0,
                      max_completion_tokens=5, include_response_headers=True, stream_usage=False,
                      http_client=httpx.Client(verify=d.trust), http_async_client=httpx.AsyncClient(verify=d.trust))


def test_langchain_stream_then_feedback_reaches_the_topic(door: Door, kafka_bootstrap: str,  # noqa: F811
                                                            ns: Topics) -> None:  # noqa: F811
    """LangChain streams keep no `apprentice` body field; the header it copies into the first chunk's
    metadata (`include_response_headers`) names the interaction, and feedback on it lands on the topic."""
    llm = _lc(door)
    merged: AIMessageChunk | None = None
    for chunk in llm.stream("hello?"):
        merged = chunk if merged is None else merged + chunk
    assert isinstance(merged, AIMessageChunk)
    streamed = interaction_id_of(merged)
    whole = llm.invoke("hello?")
    sdk_answer = door.sdk().chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=3)
    acks = [feedback(door.sdk(), merged, "thumbs", 1), feedback(door.sdk(), whole, "rating", 4),
            feedback(door.sdk(), sdk_answer, "kpi", 2.5, kpi_name="resolved")]
    assert all(a["accepted"] and a["event_id"] for a in acks)
    wanted = [a["event_id"] for a in acks]
    got = {e.envelope.event_id: e for e in collect(kafka_bootstrap, ns.feedback, events_pb2.FeedbackEvent,
                                                   want=wanted, key=lambda m: m.envelope.event_id)}
    assert [got[w].interaction_id for w in wanted] == [streamed, interaction_id_of(whole), sdk_answer.id]
    assert got[wanted[2]].kpi_name == "resolved" and got[wanted[0]].envelope.tenant == "acme"
    with door.grpc() as g:            # the gRPC door of the same helper
        ack = feedback(g, sdk_answer, "thumbs", -1)
    assert ack["accepted"]


def _check_alternatives(tokens: list[ChatCompletionTokenLogprob], k: int) -> None:
    """Sorted, k of them, bytes on each, and the chosen token among them with its own log-prob (top_k = k
    keeps the draw inside the k most likely, so it must appear)."""
    assert tokens
    for t in tokens:
        alts = t.top_logprobs
        assert len(alts) == k and all(a.bytes for a in alts)
        values = [a.logprob for a in alts]
        assert values == sorted(values, reverse=True) and len({a.token for a in alts}) > 1
        chosen = [a for a in alts if a.token == t.token]
        assert chosen and chosen[0].logprob == pytest.approx(t.logprob, abs=1e-4)
        assert math.fsum(math.exp(v) for v in values) == pytest.approx(1.0, abs=1e-3)   # top_k = k: all the mass


def test_top_logprobs_alternatives_whole_streamed_and_legacy(door: Door) -> None:  # noqa: F811
    client = door.sdk()
    r = client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=6, temperature=0.9,
                                       logprobs=True, top_logprobs=4, extra_body={"top_k": 4}, seed=3)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    _check_alternatives(content or [], 4)
    streamed: list[ChatCompletionTokenLogprob] = []
    for chunk in client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=6, stream=True,
                                                temperature=0.9, logprobs=True, top_logprobs=4,
                                                extra_body={"top_k": 4}):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed += c.logprobs.content
    _check_alternatives(streamed, 4)
    text = client.completions.create(model=door.model, prompt="Once upon", max_tokens=5, temperature=0.9,
                                     logprobs=3, extra_body={"top_k": 3})
    lp = text.choices[0].logprobs
    assert lp is not None and lp.top_logprobs and lp.tokens and lp.token_logprobs
    for tok, chosen, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(alts) <= 3 and list(alts.values()) == sorted(alts.values(), reverse=True)
        assert alts[tok] == pytest.approx(chosen, abs=1e-4)
    greedy = client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=3, logprobs=True,
                                            top_logprobs=2, temperature=0)
    greedy_tokens = greedy.choices[0].logprobs.content if greedy.choices[0].logprobs else None
    assert greedy_tokens
    for t in greedy_tokens:
        # greedy decoding is a point mass (its recorded 0.0): the argmax first, the other alternative floored
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == 0.0
        assert t.top_logprobs[1].logprob == -9999.0
