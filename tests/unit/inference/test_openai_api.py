"""The OpenAI-compatible HTTP API's pure parts: request translation, error mapping, model listing and
resolution, log-prob shapes (no network; the tiny model's tokenizer where tokens are rendered)."""

from __future__ import annotations

from typing import Any

import pytest

from services.inference.openai_api import models as M
from services.inference.openai_api.errors import ModelNotFound, error_response
from services.inference.openai_api.responses import Served, TokenText, chat_completion, text_completion
from services.inference.openai_api.schemas import SEED_SPACE, parse_chat, parse_completion, parse_feedback
from services.inference.routing import RoutingTable
from shared.decoding.params import Sample
from shared.proto.apprentice.v1 import events_pb2
from shared.rpc.grpc_util import (
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
    Unauthenticated,
    Unavailable,
)
from shared.security.identity import ANONYMOUS, Identity, Role

MSG = [{"role": "user", "content": "hi"}]


# --- requests --> GenerateRequest --------------------------------------------------------------------
def test_chat_request_becomes_the_grpc_proto_with_openai_defaults() -> None:
    req = parse_chat({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                                 {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]}],
                      "user": "u-1", "stop": "END", "max_tokens": 7, "task": "support", "tenant": "acme"})
    g = req.to_proto()
    assert [(m.role, m.content) for m in g.messages] == [("system", "be brief"), ("user", "ab")]
    assert g.sampling.temperature == 1.0 and g.sampling.top_p == 1.0      # OpenAI's defaults, not greedy
    assert g.sampling.max_new_tokens == 7 and list(g.sampling.stop) == ["END"] and g.sampling.n == 1
    assert g.session_id == "u-1" and g.task == "support" and g.tenant == "acme" and g.sampling.seed == 0


def test_max_completion_tokens_wins_and_session_id_beats_user() -> None:
    g = parse_chat({"messages": MSG, "max_tokens": 5, "max_completion_tokens": 9, "user": "u",
                    "session_id": "s", "temperature": 0}).to_proto()
    assert g.sampling.max_new_tokens == 9 and g.session_id == "s" and g.sampling.temperature == 0.0


@pytest.mark.parametrize(("seed", "sent"), [(0, SEED_SPACE), (5, 5), (SEED_SPACE + 5, 5), (-1, SEED_SPACE - 1)])
def test_every_openai_seed_is_a_seed(seed: int, sent: int) -> None:
    assert parse_chat({"messages": MSG, "seed": seed}).to_proto().sampling.seed == sent


def test_completion_request_defaults_and_prompt_forms() -> None:
    g = parse_completion({"prompt": ["Once"]}).to_proto()
    assert g.prompt == "Once" and not g.messages and g.sampling.max_new_tokens == 16
    with pytest.raises(InvalidRequest, match="one text prompt"):
        parse_completion({"prompt": ["a", "b"]}).to_proto()
    with pytest.raises(InvalidRequest, match="one text prompt"):
        parse_completion({"prompt": [1, 2, 3]}).to_proto()
    with pytest.raises(InvalidRequest, match="best_of"):
        parse_completion({"prompt": "x", "best_of": 3}).to_proto()


@pytest.mark.parametrize(("body", "needle", "param"), [
    ({"messages": MSG, "tools": [{"type": "function"}]}, "`tools.0.function` field required", "tools"),
    ({"messages": MSG, "presence_penalty": 0.5}, "presence_penalty is not supported", "presence_penalty"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs needs logprobs", "top_logprobs"),
    ({"messages": MSG, "top_logprobs": 21, "logprobs": True}, "top_logprobs", "top_logprobs"),
    ({"messages": MSG, "stream_options": {"include_usage": True}}, "only allowed when stream", "stream_options"),
    ({"messages": MSG, "n": 0}, "`n`", "n"),
    ({"messages": MSG, "max_tokens": 0}, "`max_tokens`", "max_tokens"),
    ({"messages": "hi"}, "`messages`", "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts", "messages"),
    ([1, 2], "must be a JSON object", None),
])
def test_bad_bodies_are_400_with_the_parameter(body: Any, needle: str, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_chat(body).to_proto()
    status, err, _ = error_response(e.value)
    assert status == 400 and needle in err["error"]["message"] and err["error"]["param"] == param


def test_inactive_values_of_unsupported_parameters_pass() -> None:
    parse_chat({"messages": MSG, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
                "frequency_penalty": 0, "logit_bias": {}, "store": True, "metadata": {"k": "v"}})


def test_feedback_body_is_the_json_form_of_feedback_request() -> None:
    fb = parse_feedback({"interaction_id": "abc", "kind": "kpi", "value": 2.5, "kpi_name": "csat",
                         "occurred_at": "2026-01-02T03:04:05Z"})
    assert fb.interaction_id == "abc" and fb.kpi_name == "csat" and fb.occurred_at.seconds > 0
    with pytest.raises(InvalidRequest, match="feedback request"):
        parse_feedback({"interaction_id": "abc", "kind": "thumbs", "colour": "red"})


# --- errors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("exc", "status", "kind"), [
    (InvalidRequest("sampling.temperature must be within [0, 5]; got 9"), 400, "invalid_request_error"),
    (Unauthenticated("unknown or revoked key"), 401, "authentication_error"),
    (PermissionDenied("this key acts for tenant 'a'"), 403, "permission_error"),
    (NotFound("no such thing"), 404, "not_found_error"),
    (ResourceExhausted("too much feedback"), 429, "rate_limit_error"),
    (Unavailable("the model is still loading"), 503, "server_error"),
    (ServiceError("engine broke"), 500, "server_error"),
])
def test_service_errors_map_to_openai_statuses(exc: ServiceError, status: int, kind: str) -> None:
    got, body, headers = error_response(exc)
    assert got == status and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind and body["error"]["message"]
    assert ("Retry-After" in headers) == (status == 429)


def test_validation_messages_use_the_http_parameter_names() -> None:
    _, body, _ = error_response(InvalidRequest("sampling.max_new_tokens must be <= 2048; got 5000"))
    assert body["error"]["message"] == "max_tokens must be <= 2048; got 5000"
    assert body["error"]["param"] == "max_tokens"


def test_retry_after_follows_the_cause() -> None:
    e = ResourceExhausted("tenant over its token rate")
    e.retry_after_s = 7.4   # type: ignore[attr-defined]
    assert error_response(e)[2]["Retry-After"] == "7"


def test_unknown_model_is_model_not_found() -> None:
    status, body, _ = error_response(ModelNotFound("nope"))
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


# --- models --------------------------------------------------------------------------------------------
def _table() -> RoutingTable:
    t = RoutingTable()
    for tenant, version, action, fraction in [("", "v2", events_pb2.UPDATE_ACTION_PROMOTE, 0.0),
                                              ("", "v3", events_pb2.UPDATE_ACTION_CANARY, 0.1),
                                              ("acme", "acme-lora-1", events_pb2.UPDATE_ACTION_PROMOTE, 0.0),
                                              ("globex", "globex-lora-1", events_pb2.UPDATE_ACTION_PROMOTE, 0.0)]:
        t = t.apply(events_pb2.ModelUpdate(model="m", tenant=tenant, version=version, action=action,
                                           canary_fraction=fraction))
    return t


def test_models_list_the_served_model_and_the_versions_a_caller_may_use() -> None:
    table = _table()
    acme = Identity("acme-key", Role.BACKEND, "acme")
    assert [m.id for m in M.listing(table, "m", acme)] == ["m", "base", "v2", "v3", "acme-lora-1"]
    assert {m.id for m in M.listing(table, "m", ANONYMOUS)} == {"m", "base", "v2", "v3", "acme-lora-1",
                                                               "globex-lora-1"}
    card = M.listing(table, "m", acme)[-1].card("m", 123)
    assert card == {"id": "acme-lora-1", "object": "model", "created": 123, "owned_by": "acme",
                    "root": "acme-lora-1", "parent": "m"}


def test_model_names_resolve_to_routes_or_pins_within_the_tenant() -> None:
    table = _table()
    assert M.resolve(table, "m", "", "acme") is None and M.resolve(table, "m", "m", "acme") is None
    assert M.resolve(table, "m", "v3", "acme") == ("v3", True)
    assert M.resolve(table, "m", "acme-lora-1", "acme") == ("acme-lora-1", False)
    assert M.resolve(table, "m", "base", "globex") == ("base", False)
    with pytest.raises(ModelNotFound):
        M.resolve(table, "m", "acme-lora-1", "globex")      # another tenant's adapter
    with pytest.raises(ModelNotFound):
        M.resolve(table, "m", "gpt-4o", "acme")


# --- responses -----------------------------------------------------------------------------------------
def test_bodies_carry_ids_version_usage_and_one_logprob_per_token(tiny: tuple[Any, Any]) -> None:
    _, tok = tiny
    text = TokenText(tok)
    ids = tok(" héllo wörld", add_special_tokens=False)["input_ids"]
    s = Sample(token_ids=ids, text=" héllo wörld", logprobs=[-0.5] * len(ids), logprobs_t1=[-1.0] * len(ids),
               finish_reason="length")
    served = Served.now(["id-0", "id-1"], "v2", "sess", "m", prompt_tokens=4)
    body = chat_completion(served, [s, s], text, logprobs=1)
    assert body["id"] == "id-0" and body["system_fingerprint"] == "v2" and body["object"] == "chat.completion"
    assert body["apprentice"] == {"interaction_ids": ["id-0", "id-1"], "policy_version": "v2", "session_id": "sess"}
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2 * len(ids), "total_tokens": 4 + 2 * len(ids),
                             "prompt_tokens_details": {"cached_tokens": 0}}
    content = body["choices"][1]["logprobs"]["content"]
    assert len(content) == len(ids)
    assert bytes(b for c in content for b in c["bytes"]).decode() == " héllo wörld"   # exact bytes, joined
    assert all(c["top_logprobs"] == [{k: c[k] for k in ("token", "logprob", "bytes")}] for c in content)
    assert chat_completion(served, [s], text, logprobs=0)["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    assert chat_completion(served, [s], text, logprobs=None)["choices"][0]["logprobs"] is None
    legacy = text_completion(served, [s], text, logprobs=0)["choices"][0]["logprobs"]
    assert len(legacy["tokens"]) == len(legacy["token_logprobs"]) == len(legacy["text_offset"]) == len(ids)
    assert legacy["top_logprobs"] is None and legacy["text_offset"][0] == 0
