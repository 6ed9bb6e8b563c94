"""Request validation (precise INVALID_ARGUMENT messages), tenancy/auth, and the events built from requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.inference.openai_api.errors import error_response
from services.inference.requests import (
    ContextLengthExceeded,
    feedback_event,
    interaction_event,
    prepare,
    resolve_tenant,
)
from services.inference.settings import InferenceSettings
from shared.contracts.events import deterministic_id, timestamp
from shared.decoding.params import Sample
from shared.proto.apprentice.v1 import common_pb2, inference_pb2
from shared.rpc.grpc_util import InvalidRequest, PermissionDenied
from shared.security.identity import Identity, Role, acting_as
from shared.security.keys import KeyRing


class Metadata:
    """A gRPC servicer context reduced to what the code reads: the call's metadata."""

    def __init__(self, **md: str) -> None:
        self.md = [(k.replace("_", "-"), v) for k, v in md.items()]

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.md


@pytest.fixture(scope="module")
def tok(tiny_model_name: str) -> Any:
    from shared.models import load_tokenizer

    return load_tokenizer(tiny_model_name)


def _req(**kw: Any) -> inference_pb2.GenerateRequest:
    sampling = kw.pop("sampling", {})
    if "messages" not in kw and "prompt" not in kw:
        kw["messages"] = [common_pb2.ChatMessage(role="user", content="hi")]
    return inference_pb2.GenerateRequest(sampling=common_pb2.SamplingParams(**sampling), **kw)


@pytest.mark.parametrize(("kw", "message"), [
    ({"messages": []}, "give either `messages` (chat) or `prompt`"),
    ({"prompt": "x", "messages": [common_pb2.ChatMessage(role="user", content="y")]}, "not both"),
    ({"messages": [common_pb2.ChatMessage(role="bot", content="y")]}, "messages[0].role must be one of"),
    ({"messages": [common_pb2.ChatMessage(role="user", content="")]}, "messages[0].content is empty"),
    ({"sampling": {"temperature": -0.5}}, "sampling.temperature must be within [0, 5]"),
    ({"sampling": {"temperature": float("nan")}}, "sampling.temperature"),
    ({"sampling": {"top_p": 1.5}}, "sampling.top_p must be within [0, 1]"),
    ({"sampling": {"top_k": -1}}, "sampling.top_k must be >= 0"),
    ({"sampling": {"n": 17, "temperature": 1}}, "sampling.n must be within 1..16"),
    ({"sampling": {"n": 4}}, "needs temperature > 0"),
    ({"sampling": {"max_new_tokens": -3}}, "sampling.max_new_tokens must be >= 0"),
    ({"sampling": {"max_new_tokens": 5000}}, "sampling.max_new_tokens must be <= 2048"),
    ({"sampling": {"seed": -1}}, "sampling.seed must be >= 0"),
    ({"sampling": {"stop": [""]}}, "sampling.stop[0] must be 1-64 characters"),
    ({"prompt": "word " * 3000}, "the context window is 2048"),
    ({"prompt": "hello", "sampling": {"max_new_tokens": 2048}}, "exceeds the context window (2048)"),
])
def test_bad_requests_are_refused_precisely(tok: Any, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        prepare(_req(**kw), "acme", InferenceSettings(), tok, 2048, "s-new")
    assert message in str(e.value)


@pytest.mark.parametrize(("kw", "param"), [
    ({"prompt": "word " * 3000}, "prompt"),
    ({"messages": [common_pb2.ChatMessage(role="user", content="word " * 3000)]}, "messages"),
    ({"prompt": "hello", "sampling": {"max_new_tokens": 2048}}, "prompt"),
])
def test_an_over_long_prompt_is_openais_context_length_exceeded(tok: Any, kw: dict[str, Any], param: str) -> None:
    """Agent frameworks trim their history on this exact code; gRPC callers get INVALID_ARGUMENT saying so."""
    with pytest.raises(ContextLengthExceeded) as e:
        prepare(_req(**kw), "acme", InferenceSettings(), tok, 2048, "s-new")
    assert e.value.code.name == "INVALID_ARGUMENT" and "context length exceeded" in str(e.value)
    status, body, _ = error_response(e.value)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == param


def test_defaults_are_filled_in_and_recorded(tok: Any) -> None:
    s = InferenceSettings(default_max_new_tokens=32)
    p = prepare(_req(prompt="Hello", sampling={"top_p": 0.0, "seed": (1 << 40) + 3}), "acme", s, tok, 2048, "s-new")
    assert p.raw_prompt and p.session_id == "s-new" and p.messages[0].role == "user"
    assert p.sampling.max_new_tokens == 32 and p.sampling.top_p == 1.0 and p.sampling.n == 1
    assert p.sampling.seed == 3 and p.effective.seed == (1 << 40) + 3    # reduced modulo 2^31, recorded as given
    near = prepare(_req(prompt="Hello"), "acme", s, tok, len(p.prompt_ids) + 5, "x")
    assert near.sampling.max_new_tokens == 5                             # the default shrinks to what fits


def test_interaction_event_carries_everything_the_trainer_needs(tok: Any) -> None:
    p = prepare(_req(sampling={"temperature": 0.7, "n": 2}, session_id="sess", task="support"), "acme",
                InferenceSettings(), tok, 2048, "x")
    sample = Sample(token_ids=[5, 6, 2], text="ab", logprobs=[-0.1, -0.2, -0.3], logprobs_t1=[-0.5, -0.6, -0.7],
                    finish_reason="stop")
    ev = interaction_event(p, sample, interaction_id="i-1", group_id="g", index=1, model="m", version="v3",
                           canary=True, pod="pod-a", latency_ms=12.5, trace_id="t")
    assert ev.envelope.event_id == deterministic_id("interaction", "i-1") and ev.envelope.tenant == "acme"
    assert ev.session_id == "sess" and ev.task == "support" and ev.policy_version == "v3" and ev.canary
    assert list(ev.response_token_ids) == [5, 6, 2] and len(ev.response_logprobs) == 3
    assert list(ev.prompt_token_ids) == p.prompt_ids and ev.prompt_text == p.prompt_text
    assert ev.group_size == 2 and ev.sample_index == 1 and ev.sampling.n == 2 and not ev.raw_prompt


def test_tenant_from_field_metadata_or_default_without_keys() -> None:
    s = InferenceSettings()
    assert resolve_tenant("", Metadata(), s) == "default"
    assert resolve_tenant("", Metadata(x_apprentice_tenant="globex"), s) == "globex"
    assert resolve_tenant("acme", Metadata(x_apprentice_tenant="globex"), s) == "acme"
    with pytest.raises(InvalidRequest, match="tenant"):
        resolve_tenant("a/b", Metadata(), s)


def test_a_backend_key_decides_the_tenant() -> None:
    s = InferenceSettings()
    with acting_as(Identity("globex-backend", Role.BACKEND, tenant="globex")):
        assert resolve_tenant("", Metadata(), s) == "globex"
        assert resolve_tenant("globex", Metadata(x_apprentice_tenant="globex"), s) == "globex"
        with pytest.raises(PermissionDenied, match="acts for tenant 'globex'"):
            resolve_tenant("acme", Metadata(), s)
        with pytest.raises(PermissionDenied, match="acts for tenant 'globex'"):
            resolve_tenant("", Metadata(x_apprentice_tenant="acme"), s)
    with acting_as(Identity("ops", Role.OPERATOR)):            # operators name the tenant they act for
        assert resolve_tenant("acme", Metadata(), s) == "acme"


def test_deprecated_api_keys_become_backend_entries() -> None:
    s = InferenceSettings(api_keys="k1:acme, k2:globex")
    ring = KeyRing(s.legacy_key_entries())
    found = ring.lookup_token("k2")
    assert found is not None and found.role is Role.BACKEND and found.tenant == "globex"
    assert ring.lookup_token("nope") is None
    with pytest.raises(ValueError, match="key:tenant"):
        InferenceSettings(api_keys="justakey")


def test_feedback_validation_and_deterministic_ids() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ok = inference_pb2.FeedbackRequest(interaction_id="i1", kind="rating", value=4,
                                       occurred_at=timestamp(now - timedelta(hours=3)))
    a, b = feedback_event(ok, "acme", "p", now=now), feedback_event(ok, "acme", "p", now=now)
    assert a.envelope.event_id == b.envelope.event_id                     # a retried submission is the same event
    assert a.envelope.occurred_at.ToDatetime(tzinfo=UTC) == now - timedelta(hours=3)
    bad = [
        (inference_pb2.FeedbackRequest(kind="thumbs", value=1), "interaction_id is required"),
        (inference_pb2.FeedbackRequest(interaction_id="i", kind="like"), "kind must be one of"),
        (inference_pb2.FeedbackRequest(interaction_id="i", kind="thumbs", value=0.5), "value +1 or -1"),
        (inference_pb2.FeedbackRequest(interaction_id="i", kind="rating", value=7), "within [1, 5]"),
        (inference_pb2.FeedbackRequest(interaction_id="i", kind="correction"), "corrected answer"),
        (inference_pb2.FeedbackRequest(interaction_id="i", kind="kpi", value=3), "kpi_name"),
        (inference_pb2.FeedbackRequest(interaction_id="i", kind="thumbs", value=1,
                                       occurred_at=timestamp(now + timedelta(hours=1))), "in the future"),
    ]
    for req, message in bad:
        with pytest.raises(InvalidRequest, match=message.replace("+", r"\+").replace("[", r"\[")):
            feedback_event(req, "acme", "p", now=now)
