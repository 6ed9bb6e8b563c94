"""`apprentice_client.interaction_id_of` on each answer form the SDKs hand back, built with their own model
classes (openai, langchain_core), and the error when an object names no interaction."""

from __future__ import annotations

import httpx
import pytest
from apprentice_client import NoInteractionId, interaction_id_of, session_id_of
from langchain_core.messages import AIMessage, AIMessageChunk
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

EXT = {"apprentice": {"interaction_ids": ["i-0", "i-1"], "policy_version": "base", "session_id": "s 1"}}


def test_sdk_objects_headers_and_langchain_messages() -> None:
    chat = ChatCompletion.model_validate({"id": "i-0", "object": "chat.completion", "created": 1, "model": "m",
                                          "choices": [], **EXT})
    assert [interaction_id_of(chat, i) for i in (0, 1)] == ["i-0", "i-1"] and session_id_of(chat) == "s 1"
    chunk = ChatCompletionChunk.model_validate({"id": "i-0", "object": "chat.completion.chunk", "created": 1,
                                                "model": "m", "choices": []})
    assert interaction_id_of(chunk) == "i-0"
    with pytest.raises(NoInteractionId):
        interaction_id_of(chunk, 1)                   # a later chunk keeps only the first choice's id
    resp = Response.model_validate({"id": "i-9", "created_at": 1, "model": "m", "object": "response", "output": [],
                                    "parallel_tool_calls": True, "tool_choice": "auto", "tools": []})
    assert interaction_id_of(resp) == "i-9"
    raw = httpx.Response(200, headers={"x-apprentice-interaction-ids": "a,b", "x-apprentice-session-id": "s%201"})
    assert interaction_id_of(raw, 1) == "b" and session_id_of(raw) == "s 1"
    lc = AIMessageChunk(content="x", id="run-123", response_metadata={"headers": {"X-Apprentice-Interaction-Ids": "h0,h1"}})
    assert interaction_id_of(lc, 1) == "h1"
    assert interaction_id_of(AIMessage(content="x", response_metadata={"id": "i-5"})) == "i-5"
    with pytest.raises(NoInteractionId, match="include_response_headers"):
        interaction_id_of(AIMessageChunk(content="x", id="run-123"))
    assert interaction_id_of({"id": "i-7"}) == "i-7" and interaction_id_of("i-8") == "i-8"
