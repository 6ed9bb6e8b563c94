"""One served prompt per request (services/inference/prompt.py): tools, tool calls and results, knowledge notes
and redaction all end up in the prompt the engine receives, and the captured Interaction records that prompt,
byte for byte. The real tokenizer, the real TF-IDF retriever and the real PII detector; the request goes
through the edge's steps in the server's order (services/inference/service.py `InferenceApp.prepare`)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from services.inference.knowledge import ServedKnowledge
from services.inference.privacy import CapturePrivacy
from services.inference.prompt import build_prompt
from services.inference.requests import ContextLengthExceeded, fit_completion, interaction_event, prepare
from services.inference.settings import InferenceSettings, KnowledgeSettings
from shared.contracts.events import make_envelope
from shared.decoding.params import Sample
from shared.knowledge.frame import KNOWLEDGE_HEADER
from shared.proto.apprentice.v1 import common_pb2, events_pb2, inference_pb2

ITEM = "We use return form RF-7734 for every return."
QUESTION = "Which form do I need to return my boots?"
EMAIL = "dana.w@example.com"
RESULT = "order 7: boots, delivered on 3 May"
FORM_TOOL = common_pb2.Tool(name="find_order", description="Find a customer's order",
                            parameters_json=json.dumps({"type": "object", "properties": {"item": {"type": "string"}}}))
CALL = common_pb2.ToolCall(id="call_1", name="find_order", arguments='{"item": "boots"}')


@pytest.fixture(scope="module")
def tok(tiny_model_name: str) -> Any:
    from shared.models import load_tokenizer

    return load_tokenizer(tiny_model_name)


def settings() -> InferenceSettings:
    return InferenceSettings(pod_id="pod-1", port=0, metrics_port=0, http_port=0, knowledge=KnowledgeSettings(retriever="tfidf"))


def knowledge(s: InferenceSettings) -> ServedKnowledge:
    served = ServedKnowledge(s)
    snap = events_pb2.KnowledgeSnapshot(key="acme/support", domain="support", version=1,
                                        envelope=make_envelope("acme", source="extractor"))
    snap.items.add(item_id="form", text=ITEM, status=events_pb2.ITEM_STATUS_APPROVED, revision=1,
                   questions=["Which form do I need to return something?"], token_count=12)
    assert served.apply(snap)
    return served


def served_and_recorded(tok: Any, messages: list[common_pb2.ChatMessage], **kw: Any) -> tuple[Any, Any]:
    """A tools request prepared by the edge's steps, then one served choice captured: (request, Interaction)."""
    s = settings()
    req = inference_pb2.GenerateRequest(messages=messages, tools=[FORM_TOOL], task="support",
                                        sampling=common_pb2.SamplingParams(max_new_tokens=8), **kw)
    p = prepare(req, "acme", s, tok, 2048, new_session_id=str(uuid.uuid4()))
    cp = CapturePrivacy(s, lambda: tok)
    cp.screen_request(p)
    cp.redact_prompt(p)
    knowledge(s).augment(p, tok, 2048)
    ids = tok("Form RF-7734.", add_special_tokens=False)["input_ids"]
    sample = Sample(token_ids=ids, text="Form RF-7734.", logprobs=[-0.5] * len(ids), logprobs_t1=[-0.6] * len(ids),
                    finish_reason="stop")
    ev = interaction_event(p, sample, interaction_id="i1", group_id="g", index=0, model="m", version="base",
                           canary=False, pod="pod-1", latency_ms=1.0, trace_id="t")
    [ev] = cp.interactions(p, [ev])
    return p, ev


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role="user", content=text)


def assert_one_prompt(p: Any, ev: Any) -> None:
    """What the engine receives (`p.prompt_ids`) is what the Interaction records, and holds notes and tools."""
    assert list(ev.prompt_token_ids) == p.prompt_ids and ev.prompt_text == p.prompt_text
    assert KNOWLEDGE_HEADER in p.prompt_text and json.dumps(ITEM) in p.prompt_text, "the notes are served"
    assert "<tools>" in p.prompt_text and '"name": "find_order"' in p.prompt_text, "the tools are served"
    assert [r.item_id for r in ev.knowledge_items] == ["form"] and [t.name for t in ev.tools] == ["find_order"]
    assert KNOWLEDGE_HEADER not in "".join(m.content for m in ev.messages), "the recorded messages hold no frame"


def test_a_tools_request_with_matching_knowledge_is_served_and_recorded_with_notes_and_tools(tok: Any) -> None:
    p, ev = served_and_recorded(tok, [user(QUESTION)])
    assert_one_prompt(p, ev)
    # the same request opting out of knowledge: the same prompt without the notes, tools still there
    q, _ = served_and_recorded(tok, [user(QUESTION)], no_knowledge=True)
    assert "<tools>" in q.prompt_text and KNOWLEDGE_HEADER not in q.prompt_text and len(q.prompt_ids) < len(p.prompt_ids)


def test_with_personal_data_the_served_ids_are_the_recorded_ids(tok: Any) -> None:
    p, ev = served_and_recorded(tok, [user(f"{QUESTION} Write to {EMAIL}.")])
    assert_one_prompt(p, ev)
    assert p.prompt_privacy == "redacted" and EMAIL not in p.prompt_text and "<EMAIL_ADDRESS>" in p.prompt_text
    assert EMAIL not in str(ev) and ev.messages[0].content == f"{QUESTION} Write to <EMAIL_ADDRESS>."
    assert EMAIL in p.messages[0].content, "the request keeps the caller's messages as sent (the scans read them)"


def test_a_tool_result_turn_with_knowledge_keeps_the_tool_result(tok: Any) -> None:
    p, ev = served_and_recorded(tok, [
        user(QUESTION), common_pb2.ChatMessage(role="assistant", tool_calls=[CALL]),
        common_pb2.ChatMessage(role="tool", tool_call_id="call_1", name="find_order", content=RESULT)])
    assert_one_prompt(p, ev)
    assert f"<tool_response>\n{RESULT}\n</tool_response>" in p.prompt_text, "the tool result is served"
    assert "<tool_call>" in p.prompt_text and '"item": "boots"' in p.prompt_text, "the call it answers too"
    assert [m.role for m in ev.messages] == ["user", "assistant", "tool"] and ev.messages[2].content == RESULT
    assert ev.messages[1].tool_calls[0].id == "call_1"


def test_the_prompt_is_the_same_whichever_step_comes_first(tok: Any) -> None:
    """Redaction and notes are inputs of `build_prompt`: redacting a prompt that holds notes, or adding the
    notes to a redacted prompt, gives the same text and ids."""
    msgs = [common_pb2.ChatMessage(role="system", content="You help."), user(f"{QUESTION} Mail {EMAIL}.")]
    clean = [msgs[0], user(f"{QUESTION} Mail <EMAIL_ADDRESS>.")]
    tools = [_spec()]
    first = build_prompt(tok, msgs, tools).with_notes(tok, [ITEM]).redact(tok, clean, tools)
    second = build_prompt(tok, msgs, tools).redact(tok, clean, tools).with_notes(tok, [ITEM])
    direct = build_prompt(tok, clean, tools, [ITEM], redacted=True)
    assert first.text == second.text == direct.text and first.ids == second.ids == direct.ids
    assert first.redacted and first.notes == (ITEM,) and list(first.messages) == clean
    # the system turn holds the caller's text, then the tools, then the notes
    system = first.text.split("<|im_end|>", 1)[0]
    assert system.index("You help.") < system.index("<tools>") < system.index(KNOWLEDGE_HEADER)
    with pytest.raises(ValueError, match="raw prompt"):
        build_prompt(tok, [user("Once upon a time")], notes=[ITEM], raw=True)


def test_a_redacted_prompt_that_grew_shrinks_a_default_completion_and_refuses_an_asked_one(tok: Any) -> None:
    s = settings()
    req = inference_pb2.GenerateRequest(messages=[user(f"Mail {EMAIL}")])
    longer = build_prompt(tok, [user("Mail <EMAIL_ADDRESS>, <EMAIL_ADDRESS> and <EMAIL_ADDRESS>")], redacted=True)
    window = len(longer.ids) + 2
    p = prepare(req, "acme", s, tok, window, new_session_id="s")
    assert p.sampling.max_new_tokens == window - len(p.prompt_ids) > 2
    p.prompt = longer
    fit_completion(p, window, " once redacted")
    assert p.sampling.max_new_tokens == p.effective.max_new_tokens == 2
    asked = prepare(inference_pb2.GenerateRequest(messages=req.messages,
                                                  sampling=common_pb2.SamplingParams(max_new_tokens=3)),
                    "acme", s, tok, window, new_session_id="s")
    asked.prompt = longer
    with pytest.raises(ContextLengthExceeded, match="once redacted"):
        fit_completion(asked, window, " once redacted")


def _spec() -> Any:
    from shared.decoding.tool_calls import parse_tool

    return parse_tool(FORM_TOOL.name, FORM_TOOL.description, FORM_TOOL.parameters_json, False, 0)
