"""The capture edge's PII policies (redact / reject / keep) on real events, the real detector and the tiny
model's tokenizer: what is served, what reaches the spool, what the trainer gets, and what a refusal says.
Each request goes through the edge's steps in the server's order: prepare, screen, redact the prompt before it
is served, build the choices' events from the served prompt, capture them."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from services.inference.privacy import FAILED, CapturePrivacy
from services.inference.requests import feedback_event, interaction_event, prepare
from services.inference.settings import InferenceSettings
from shared.decoding.chat_template import encode_chat, encode_text
from shared.decoding.params import Sample
from shared.privacy.detector import conversation_pairs, joins
from shared.privacy.policy import Redactor
from shared.proto.apprentice.v1 import common_pb2, inference_pb2
from shared.rpc.grpc_util import InvalidRequest
from shared.security.pseudonyms import PREFIX
from tests.helpers.privacy import CountingDetector

EMAIL, CARD, NAME = "dana.w@example.com", "4111.1111.1111.1111", "Dana Whitfield"
PROMPT = f"Hi, my name is {NAME}. Refund card {CARD} and write to {EMAIL}."


@pytest.fixture(scope="module")
def tok(tiny_model_name: str) -> Any:
    from shared.models import load_tokenizer

    return load_tokenizer(tiny_model_name)


def settings(**kw: Any) -> InferenceSettings:
    return InferenceSettings(pod_id="pod-1", **kw)


def privacy(tok: Any, **kw: Any) -> CapturePrivacy:
    return CapturePrivacy(settings(**kw), lambda: tok)


def event(tok: Any, s: InferenceSettings, answer: str = "Done.", *, raw: bool = False, tenant: str = "acme",
          cp: CapturePrivacy | None = None) -> Any:
    """A prepared request and one choice's event; with `cp`, its prompt checked (redacted) before it is served."""
    req = (inference_pb2.GenerateRequest(prompt=PROMPT) if raw else inference_pb2.GenerateRequest(messages=[
        common_pb2.ChatMessage(role="system", content="You are the support assistant of Acme."),
        common_pb2.ChatMessage(role="user", content=PROMPT)]))
    p = prepare(req, tenant, s, tok, 2048, new_session_id="s1")
    if cp is not None:
        cp.redact_prompt(p)
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    sample = Sample(token_ids=ids, text=answer, logprobs=[-0.5] * len(ids), logprobs_t1=[-0.6] * len(ids),
                    finish_reason="stop")
    return p, interaction_event(p, sample, interaction_id="i1", group_id="g", index=0, model="m", version="base",
                                canary=False, pod="pod-1", latency_ms=1.0, trace_id="t")


def leaks(text: str) -> list[str]:
    return [v for v in (EMAIL, CARD, NAME, "Whitfield") if v in text]


def test_redact_chat_prompt_is_redacted_and_retokenised(tok: Any) -> None:
    cp = privacy(tok)
    p, _ = event(tok, cp.settings)
    original_ids = list(p.prompt_ids)
    p, ev = event(tok, cp.settings, cp=cp)
    cp.interactions(p, [ev])
    user = ev.messages[1].content
    assert user == "Hi, my name is <PERSON>. Refund card <CREDIT_CARD> and write to <EMAIL_ADDRESS>."
    assert ev.messages[0].content == "You are the support assistant of Acme."
    assert not leaks(ev.prompt_text) and not leaks(str(ev))
    chat = encode_chat(tok, list(ev.messages))
    assert ev.prompt_text == chat.text and list(ev.prompt_token_ids) == chat.ids != original_ids
    # redacted before it was served: the engine's ids are the recorded ids
    assert p.prompt_privacy == "redacted" and p.prompt_ids == list(ev.prompt_token_ids)
    assert [m.content for m in p.messages][1] == PROMPT, "the caller's messages as sent stay on the request"
    # the answer had no personal data: tokens and behaviour log-probs are the trainer's as generated
    assert ev.response_text == "Done." and len(ev.response_token_ids) == len(ev.response_logprobs_t1) > 0


def test_redact_raw_prompt_and_an_answer_that_repeats_the_email(tok: Any) -> None:
    cp = privacy(tok)
    p, ev = event(tok, cp.settings, answer=f"I wrote to {EMAIL}.", raw=True, cp=cp)
    cp.interactions(p, [ev])
    assert ev.prompt_text == ev.messages[0].content and not leaks(ev.prompt_text)
    assert list(ev.prompt_token_ids) == encode_text(tok, ev.prompt_text) == p.prompt_ids
    assert ev.response_text == "I wrote to <EMAIL_ADDRESS>."
    # not what the model generated: no tokens, no log-probs (the trainer skips it; text stays for grading)
    assert not ev.response_token_ids and not ev.response_logprobs and not ev.response_logprobs_t1


def test_answers_lose_the_prompt_names_but_keep_public_figures(tok: Any) -> None:
    cp = privacy(tok)
    p, ev = event(tok, cp.settings, answer="Thanks, Dana! Albert Einstein would approve.", cp=cp)
    cp.interactions(p, [ev])
    assert ev.response_text == "Thanks, <PERSON>! Albert Einstein would approve." and not ev.response_token_ids
    p, ev = event(tok, cp.settings, answer="Albert Einstein was born in Ulm.", cp=cp)
    cp.interactions(p, [ev])
    assert ev.response_text == "Albert Einstein was born in Ulm." and ev.response_token_ids


def test_keep_captures_as_is(tok: Any) -> None:
    cp = privacy(tok, pii_policy="redact", pii_tenant_policies="acme:keep")
    p, ev = event(tok, cp.settings, cp=cp)
    assert p.prompt_privacy == "as_sent" and PROMPT in p.prompt_text      # served as sent
    before = ev.SerializeToString()
    kept = cp.interactions(p, [ev])[0]
    # the session id is the caller's identifier: pseudonymised under every policy, the text kept as sent
    assert kept.session_id.startswith(PREFIX) and kept.session_id != p.session_id
    kept.session_id = p.session_id
    assert kept.SerializeToString() == before
    fb = feedback_event(inference_pb2.FeedbackRequest(interaction_id="i1", kind="correction", comment=PROMPT), "acme",
                        "pod-1")
    assert cp.feedback(fb).comment == PROMPT


def test_reject_refuses_naming_the_types_not_the_values(tok: Any) -> None:
    cp = privacy(tok, pii_policy="keep", pii_tenant_policies="acme:reject")
    p, _ = event(tok, cp.settings)
    with pytest.raises(InvalidRequest) as e:
        cp.screen_request(p)
    msg = str(e.value)
    assert "CREDIT_CARD, EMAIL_ADDRESS, PERSON" in msg and not leaks(msg)
    fb = feedback_event(inference_pb2.FeedbackRequest(interaction_id="i1", kind="correction",
                                                      comment=f"It is {CARD}"), "acme", "pod-1")
    with pytest.raises(InvalidRequest, match="CREDIT_CARD") as e:
        cp.feedback(fb)
    assert CARD not in str(e.value)
    # clean input passes; requests that are not captured are not screened; other tenants keep
    clean = prepare(inference_pb2.GenerateRequest(prompt="How long is the warranty?"), "acme", cp.settings, tok,
                    2048, new_session_id="s")
    cp.screen_request(clean)
    p.no_capture = True
    cp.screen_request(p)
    p2, _ = event(tok, cp.settings, tenant="other")
    cp.screen_request(p2)


def test_redact_feedback_comment(tok: Any) -> None:
    cp = privacy(tok)
    req = inference_pb2.FeedbackRequest(interaction_id="i1", kind="correction",
                                        comment=f"The account holder is {NAME}; card {CARD}.")
    now = datetime(2026, 1, 2, tzinfo=UTC)
    fb = cp.feedback(feedback_event(req, "acme", "pod-1", now=now))
    assert fb.comment == "The account holder is <PERSON>; card <CREDIT_CARD>."
    assert fb.envelope.event_id == feedback_event(req, "acme", "pod-1", now=now).envelope.event_id  # retries dedupe


def test_a_failing_detector_fails_closed(tok: Any) -> None:
    class Broken:
        def find(self, text: str, *, names: bool = True) -> list:
            raise RuntimeError("model file corrupt")

    cp = CapturePrivacy(settings(), lambda: tok, Redactor(lambda: Broken()))   # type: ignore[arg-type, return-value]
    p, ev = event(tok, cp.settings, cp=cp)
    assert p.prompt_privacy == "failed" and PROMPT in p.prompt_text, "the caller is still served, as sent"
    cp.interactions(p, [ev])
    assert ev.prompt_text == ev.response_text == ev.messages[1].content == FAILED and not ev.prompt_token_ids
    assert ev.interaction_id == "i1"
    # a prompt that never went through the check is not kept either
    p, ev = event(tok, cp.settings)
    cp.interactions(p, [ev])
    assert ev.prompt_text == FAILED and not ev.prompt_token_ids
    fb = feedback_event(inference_pb2.FeedbackRequest(interaction_id="i1", kind="correction", comment=PROMPT),
                        "acme", "pod-1")
    assert cp.feedback(fb).comment == FAILED


def test_settings_validate_tenant_policies() -> None:
    s = settings(pii_tenant_policies="a:keep,b:reject")
    assert [s.pii_policy_for(t).value for t in ("a", "b", "c")] == ["keep", "reject", "redact"]
    with pytest.raises(ValueError, match="APPRENTICE_INFERENCE_PII_TENANT_POLICIES"):
        settings(pii_tenant_policies="a:forget")
    with pytest.raises(ValueError):
        settings(pii_policy="erase")
    assert not CapturePrivacy(settings(pii_policy="keep"), lambda: None).active
    assert CapturePrivacy(settings(pii_policy="keep", pii_tenant_policies="a:redact"), lambda: None).active


# --- business names and data (APPRENTICE_BUSINESS_NAMES/_DATA): the tenant's own are kept ------------
def business(tok: Any) -> CapturePrivacy:
    from shared.settings import CommonSettings

    return privacy(tok, common=CommonSettings(business_names={"acme": ["Trailmate", "Dana Whitfield"]}))


def test_a_correction_keeps_the_declared_product_and_staff_but_not_the_user(tok: Any) -> None:
    cp = business(tok)
    comment = ("This is Trailmate support: Dana Whitfield from our returns desk approves it. "
               "Dana Smith asked us to write to dana.smith@example.com.")
    req = inference_pb2.FeedbackRequest(interaction_id="i1", kind="correction", comment=comment)
    assert cp.feedback(feedback_event(req, "acme", "pod-1")).comment == (
        "This is Trailmate support: Dana Whitfield from our returns desk approves it. "
        "<PERSON> asked us to write to <EMAIL_ADDRESS>.")
    # tenant A's names exempt nothing of tenant B's text
    assert cp.feedback(feedback_event(req, "globex", "pod-1")).comment == (
        "This is <PERSON> support: <PERSON> from our returns desk approves it. "
        "<PERSON> asked us to write to <EMAIL_ADDRESS>.")


def test_a_captured_answer_keeps_the_staff_name_the_users_name_shares_a_word_with(tok: Any) -> None:
    cp = business(tok)
    req = inference_pb2.GenerateRequest(messages=[common_pb2.ChatMessage(role="user", content=(
        "Hi, I'm Dana Smith. Can Dana Whitfield approve my Trailmate return?"))])
    p = prepare(req, "acme", cp.settings, tok, 2048, new_session_id="s1")
    cp.redact_prompt(p)
    answer = "Thanks, Dana! Dana Whitfield approves Trailmate returns within 30 days."
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    sample = Sample(token_ids=ids, text=answer, logprobs=[-0.5] * len(ids), logprobs_t1=[-0.6] * len(ids),
                    finish_reason="stop")
    [ev] = cp.interactions(p, [interaction_event(p, sample, interaction_id="i1", group_id="g", index=0, model="m",
                                                 version="base", canary=False, pod="pod-1", latency_ms=1.0,
                                                 trace_id="t")])
    assert ev.messages[0].content == "Hi, I'm <PERSON>. Can Dana Whitfield approve my Trailmate return?"
    assert "Smith" not in ev.prompt_text and "Dana Whitfield" in ev.prompt_text
    assert ev.response_text == "Thanks, <PERSON>! Dana Whitfield approves Trailmate returns within 30 days."



def test_a_correction_keeps_the_tenants_declared_phone_and_email_but_not_the_users(tok: Any) -> None:
    """APPRENTICE_BUSINESS_DATA: the support desk's own number and mailbox stay in its corrections and answers;
    the customer's number and mailbox do not, and another tenant keeps neither."""
    from shared.settings import CommonSettings

    cp = privacy(tok, common=CommonSettings(business_data={"acme": {"phones": ["+44 800 414 2277"],
                                                                    "emails": ["found@trailmate.co.uk"]}}))
    comment = ("Call customer service on 0800 414 2277 or write to found@trailmate.co.uk; the customer left "
               "07700 900123 and jane.roe@gmail.com.")
    req = inference_pb2.FeedbackRequest(interaction_id="i1", kind="correction", comment=comment)
    assert cp.feedback(feedback_event(req, "acme", "pod-1")).comment == (
        "Call customer service on 0800 414 2277 or write to found@trailmate.co.uk; the customer left "
        "<PHONE_NUMBER> and <EMAIL_ADDRESS>.")
    assert cp.feedback(feedback_event(req, "globex", "pod-1")).comment == (
        "Call customer service on <PHONE_NUMBER> or write to <EMAIL_ADDRESS>; the customer left "
        "<PHONE_NUMBER> and <EMAIL_ADDRESS>.")
    req = inference_pb2.GenerateRequest(messages=[common_pb2.ChatMessage(role="user", content=(
        "My number is 07700 900123. How do I reach lost property?"))])
    p = prepare(req, "acme", cp.settings, tok, 2048, new_session_id="s1")
    cp.redact_prompt(p)
    answer = "Call +44 800 414 2277 or write to found@trailmate.co.uk; we will not call 07700 900123."
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    sample = Sample(token_ids=ids, text=answer, logprobs=[-0.5] * len(ids), logprobs_t1=[-0.6] * len(ids),
                    finish_reason="stop")
    [ev] = cp.interactions(p, [interaction_event(p, sample, interaction_id="i1", group_id="g", index=0, model="m",
                                                 version="base", canary=False, pod="pod-1", latency_ms=1.0,
                                                 trace_id="t")])
    assert ev.messages[0].content == "My number is <PHONE_NUMBER>. How do I reach lost property?"
    assert ev.response_text == ("Call +44 800 414 2277 or write to found@trailmate.co.uk; we will not call "
                                "<PHONE_NUMBER>.")


# --- each text through the detector once per request -------------------------------------------------


@pytest.fixture(scope="module")
def counting() -> CountingDetector:
    return CountingDetector()


def choices(tok: Any, s: InferenceSettings, tenant: str, prompt: str, n: int) -> Any:
    """One request of n choices, as the server prepares it."""
    req = inference_pb2.GenerateRequest(
        messages=[common_pb2.ChatMessage(role="system", content="You are the support assistant of Acme."),
                  common_pb2.ChatMessage(role="user", content=prompt)],
        sampling=common_pb2.SamplingParams(n=n, temperature=1.0))
    return prepare(req, tenant, s, tok, 2048, new_session_id="s1")


def served(tok: Any, p: Any, answers: list[str]) -> list[Any]:
    """The captured events of a served request's choices."""
    events = []
    for i, answer in enumerate(answers):
        ids = tok(answer, add_special_tokens=False)["input_ids"]
        sample = Sample(token_ids=ids, text=answer, logprobs=[-0.5] * len(ids), logprobs_t1=[-0.6] * len(ids),
                        finish_reason="stop")
        events.append(interaction_event(p, sample, interaction_id=f"i{i}", group_id="g", index=i, model="m",
                                        version="base", canary=False, pod="pod-1", latency_ms=1.0, trace_id="t"))
    return events


def joined(p: Any) -> set[str]:
    """The texts of neighbouring messages joined, which the conversation scan also reads once each (a value
    split across two messages: shared/privacy/detector.py `joins`)."""
    return {j.text for j in joins([m.content for m in p.messages], conversation_pairs([m.role for m in p.messages]))}


@pytest.mark.parametrize(("tenant", "prompt"), [("acme", PROMPT), ("strict", "How long is the warranty?")])
def test_each_text_of_a_request_is_read_by_the_detector_once(tok: Any, counting: CountingDetector, tenant: str,
                                                             prompt: str) -> None:
    """Edge screening (`reject`) and capture redaction share one scan of each message, and the n choices
    share the prompt's: with no cache to hide a repeat, every text reaches the detector exactly once."""
    cp = CapturePrivacy(settings(pii_tenant_policies="strict:reject"), lambda: tok, Redactor(lambda: counting, cache_size=0))
    answers = ["Done, Dana.", f"I wrote to {EMAIL}.", "The warranty is two years."]
    p = choices(tok, cp.settings, tenant, prompt, len(answers))
    counting.calls.clear()
    cp.screen_request(p)
    cp.redact_prompt(p)
    for ev in cp.interactions(p, served(tok, p, answers)):
        assert not leaks(ev.SerializeToString().decode("utf-8", "replace"))
    assert set(counting.calls) == {m.content for m in p.messages} | set(answers) | joined(p)
    assert set(counting.calls.values()) == {1}, counting.calls


def test_a_refused_request_is_scanned_once_and_never_again(tok: Any, counting: CountingDetector) -> None:
    cp = CapturePrivacy(settings(pii_policy="reject"), lambda: tok, Redactor(lambda: counting, cache_size=0))
    p = choices(tok, cp.settings, "acme", PROMPT, 1)
    counting.calls.clear()
    for _ in range(2):      # a handler that screens twice still reads the scans made the first time
        with pytest.raises(InvalidRequest, match="CREDIT_CARD"):
            cp.screen_request(p)
    assert counting.calls == Counter({t: 1 for t in [m.content for m in p.messages] + sorted(joined(p))})
