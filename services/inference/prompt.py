"""A request's conversation, tools, knowledge notes and redaction --> the one prompt it is served and recorded with.

`build_prompt` is the only place a Generate request's prompt is rendered. The request path supplies its inputs
and never renders by itself:
- `requests.prepare`: the caller's messages (or raw prompt) and the offered tools, validated;
- `privacy.CapturePrivacy.redact_prompt`: for a captured request, the same messages and tools with personal
  data replaced by placeholders, before anything is served;
- `knowledge.ServedKnowledge.augment`: the approved notes chosen for the request, in their injection-safe frame.
Each step replaces the request's `ServedPrompt` with a new one built from every input so far (`redact`,
`with_notes`), so whatever the order, the engine receives `prompt.ids` and every choice's Interaction records
`prompt.messages`, `prompt.tools`, `prompt.text` and `prompt.ids`: the same bytes and the same token ids. A
trainer never learns from a prompt the model was not served.

Rendering: tools, an assistant's tool calls and tool results become message content (Hermes format,
shared/decoding/tool_calls.py `render_hermes`), then the notes join the system turn (shared/knowledge/frame.py
`with_knowledge`), then the chat template encodes it with special tokens inside content kept as text
(shared/decoding/chat_template.py `encode_chat`). A raw prompt is its text, encoded as text; it takes neither
tools nor notes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.decoding.chat_template import encode_chat, encode_text
from shared.decoding.tool_calls import ToolSpec, render_hermes
from shared.knowledge.frame import with_knowledge
from shared.proto.apprentice.v1 import common_pb2


@dataclass(frozen=True, eq=False)
class ServedPrompt:
    """What the engine receives and what each choice's Interaction records (see the module docstring)."""

    messages: tuple[common_pb2.ChatMessage, ...]
    """The conversation as recorded: the caller's messages (a raw prompt: one user message), with personal data
    replaced when `redacted`; tool calls and results as structured fields, no notes, no tool definitions."""
    tools: tuple[ToolSpec, ...]
    """The offered tools as rendered and recorded (definitions redacted when they held personal data)."""
    notes: tuple[str, ...]
    """The knowledge items' texts inside the frame, most relevant first."""
    raw: bool
    """A raw `prompt` request: `messages` holds its one text, served as text (no template)."""
    text: str
    ids: list[int]
    redacted: bool = False
    """Personal data in `messages` or `tools` was replaced by placeholders before serving."""

    def with_notes(self, tokenizer: Any, notes: Sequence[str]) -> ServedPrompt:
        """The same prompt with these knowledge notes (none: without notes)."""
        return build_prompt(tokenizer, self.messages, self.tools, notes, raw=self.raw, redacted=self.redacted)

    def redact(self, tokenizer: Any, messages: Sequence[common_pb2.ChatMessage],
               tools: Sequence[ToolSpec]) -> ServedPrompt:
        """The same prompt (notes kept) built from the redacted messages and tool definitions."""
        return build_prompt(tokenizer, messages, tools, self.notes, raw=self.raw, redacted=True)


def message_dict(m: common_pb2.ChatMessage) -> dict[str, Any]:
    """A ChatMessage as the tool-call code reads it (shared/decoding/tool_calls.py)."""
    return {"role": m.role, "content": m.content, "tool_call_id": m.tool_call_id, "name": m.name,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]}


def build_prompt(tokenizer: Any, messages: Sequence[common_pb2.ChatMessage], tools: Sequence[ToolSpec] = (),
                 notes: Sequence[str] = (), *, raw: bool = False, redacted: bool = False) -> ServedPrompt:
    """Messages, tools, tool calls and results, knowledge notes --> the request's one served prompt.

    Raises whatever the chat template raises for messages it cannot render (`requests.prepare` makes it the
    request's INVALID_ARGUMENT), and ValueError for a raw prompt given tools or notes."""
    msgs = tuple(messages)
    if raw:
        if len(msgs) != 1 or tools or notes:
            raise ValueError("a raw prompt is one text, without tools or knowledge notes")
        # a raw prompt is content: `<|im_start|>system` written into it makes no role token
        text, ids = msgs[0].content, encode_text(tokenizer, msgs[0].content)
    else:
        rendered: list[dict[str, str]] = [{"role": m.role, "content": m.content} for m in msgs]
        if tools or any(m.role == "tool" or m.tool_calls for m in msgs):
            # tools, calls and results become message content, so every special token in a description, an
            # argument or a result stays text, as in any content
            rendered = render_hermes([message_dict(m) for m in msgs], tools)
        # special tokens written inside content (a note's included) stay text: only the template's own role
        # markers are control tokens
        encoded = encode_chat(tokenizer, with_knowledge(rendered, notes))
        text, ids = encoded.text, encoded.ids
    return ServedPrompt(messages=msgs, tools=tuple(tools), notes=tuple(notes), raw=raw, text=text, ids=ids,
                        redacted=redacted)
