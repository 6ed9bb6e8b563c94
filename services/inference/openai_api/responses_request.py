"""A Responses API body (`POST /v1/responses`) --> the chat completion request the other routes serve.

The Responses API is a different spelling of the same call: `instructions` is the system turn, `input`
is a string or a list of items (messages, the model's `function_call`s, the caller's
`function_call_output`s), tools are flat (`{"type": "function", "name", "parameters"}`) and the answer's
format sits in `text.format`. Translating the body into a `ChatCompletionRequest` means every check, the
tenant, the privacy screen, knowledge, constrained decoding and capture are the chat route's, unchanged:
the Responses door cannot accept what the chat door refuses.

What a conversation held before (`previous_response_id`) is prepended by the caller of `to_chat`
(services/inference/openai_api/response_store.py); as in OpenAI's API the earlier `instructions` are not
carried over. Built-in tools (web search, file search, computer use...) and non-text inputs are refused
with a 400 that names them: the served model runs none of them.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from services.inference.openai_api.errors import BadRequest, from_validation
from services.inference.openai_api.schemas import (
    INT32_MAX,
    MAX_TOP_LOGPROBS,
    ChatCompletionRequest,
    Extensions,
)
from shared.rpc.grpc_util import InvalidRequest

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The `include` entry that asks for the output text's log-probs."""
MAX_METADATA = (16, 64, 512)
"""OpenAI's bounds on `metadata`: pairs, key characters, value characters (it is kept with a stored response)."""
MAX_INPUT_ITEMS = 4096
"""More items than any conversation the context window can hold; the shared checks bound the messages."""

_TEXT_PARTS = ("input_text", "output_text", "text")
_IGNORED_INCLUDES = ("reasoning.encrypted_content",)
"""Includes that ask for nothing this server produces (it runs no reasoning model): accepted, empty."""
_REFUSED_FIELDS = {
    "conversation": "conversations are not stored by this server; send the history as input items or chain "
                    "responses with previous_response_id",
    "prompt": "stored prompt templates are not supported; send instructions and input",
    "background": "background responses are not supported; use stream for long answers",
}


class ResponsesRequest(Extensions):
    """The fields of a Responses API body that Apprentice serves (`seed` is an extension here, as the
    Apprentice ones are)."""

    model: str = ""
    input: str | list[dict[str, Any]] = Field(default="")
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    previous_response_id: str | None = Field(None, max_length=512)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    reasoning: dict[str, Any] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)

    @property
    def stored(self) -> bool:
        """OpenAI keeps responses unless `store` is false; so does this server (in memory, bounded)."""
        return self.store is not False

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    def input_messages(self) -> list[dict[str, Any]]:
        """`input` as chat messages (the history a later response continues from holds these)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}] if self.input else []
        if len(self.input) > MAX_INPUT_ITEMS:
            raise BadRequest(f"input holds {len(self.input)} items; at most {MAX_INPUT_ITEMS}", param="input")
        return items_to_messages(self.input)

    def to_chat(self, history: list[dict[str, Any]], session_id: str = "") -> ChatCompletionRequest:
        """This request continuing `history` (chat messages), as a chat completion request."""
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + history
        messages += self.input_messages()
        if not messages:
            raise BadRequest("input is empty: give a string or a list of input items", param="input")
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "stream": self.stream,
            "temperature": self.temperature, "top_p": self.top_p, "max_completion_tokens": self.max_output_tokens,
            "seed": self.seed, "user": self.user, "session_id": self.session_id or session_id, "task": self.task,
            "tenant": self.tenant, "no_capture": self.no_capture, "no_knowledge": self.no_knowledge,
            "top_k": self.top_k, "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.wants_logprobs or self.top_logprobs:
            body["logprobs"], body["top_logprobs"] = True, self.top_logprobs or 0
        if self.tools:
            body["tools"] = [_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = _tool_choice(self.tool_choice)
        if (fmt := _response_format(self.text)) is not None:
            body["response_format"] = fmt
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as e:
            raise from_validation(e, "response request") from None


def parse_responses(raw: Any) -> ResponsesRequest:
    """Validate a `/v1/responses` body: JSON types, then what this server does not do (each a 400 naming it)."""
    if not isinstance(raw, dict):
        raise BadRequest(f"the body must be a JSON object (response request); got {type(raw).__name__}")
    for name, why in _REFUSED_FIELDS.items():
        if raw.get(name) not in (None, False, "", {}):
            raise BadRequest(f"{name}: {why}", param=name)
    try:
        req = ResponsesRequest.model_validate(raw)
    except ValidationError as e:
        raise from_validation(e, "response request") from None
    pairs, key_chars, value_chars = MAX_METADATA
    meta = req.metadata or {}
    if len(meta) > pairs or any(len(k) > key_chars or len(v) > value_chars for k, v in meta.items()):
        raise BadRequest(f"metadata: at most {pairs} pairs, keys of at most {key_chars} characters and values of "
                         f"at most {value_chars}", param="metadata")
    if req.truncation not in (None, "disabled"):
        raise BadRequest(f"truncation {req.truncation!r} is not supported: an input over the context window is "
                         "refused (code context_length_exceeded), not cut", param="truncation")
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        raise BadRequest("reasoning options are not supported: the served model is not a reasoning model",
                         param="reasoning")
    for inc in req.include or []:
        if inc not in (LOGPROBS_INCLUDE, *_IGNORED_INCLUDES):
            raise BadRequest(f"include {inc[:60]!r} is not supported; this server can include "
                             f"{LOGPROBS_INCLUDE!r}", param="include")
    return req


def in_input_terms(e: Exception) -> Exception:
    """A shared check's complaint about `messages[k]` (the chat form this request was served as) --> a 400
    about `input`, saying how the index counts (instructions, earlier turns, then the input items)."""
    param = getattr(e, "param", None)
    if isinstance(e, InvalidRequest) and (str(param or "").startswith("messages") or str(e).startswith("messages")):
        return BadRequest(f"input: in the conversation as chat messages (instructions, the previous response's "
                          f"turns, then the input items), {e}", param="input")
    return e


# --- input items --> chat messages -----------------------------------------------------------------------
def _text_of(content: Any, where: str) -> str:
    """A message's content (a string or a list of parts) --> its text; non-text parts are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of content parts", param="input")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        else:
            raise BadRequest(f"{where}.content[{j}]: only text parts are supported; got "
                             f"{str(kind)[:40]!r}", param="input")
    return "".join(out)


def _str_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}.{name} must be a non-empty string", param="input")
    return value


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items --> chat messages. A model's answer comes back as a message item followed by its
    `function_call` items; they are joined into one assistant turn, as the model produced them, so the
    rendered history (and a captured trajectory) matches what was generated."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", param="input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"{where}.role must be user, system, developer or assistant; got "
                                 f"{str(role)[:40]!r}", param="input")
            messages.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _str_field(item, "call_id", where), "type": "function",
                    "function": {"name": _str_field(item, "name", where),
                                 "arguments": item.get("arguments") if isinstance(item.get("arguments"), str) else "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, where)
            messages.append({"role": "tool", "tool_call_id": _str_field(item, "call_id", where), "content": text})
        elif kind == "reasoning":
            continue            # another model's reasoning summary: this model neither reads nor writes them
        else:
            raise BadRequest(f"{where}: input items of type {str(kind)[:40]!r} are not supported (message, "
                             "function_call and function_call_output are)", param="input")
    return messages


# --- tools and formats ----------------------------------------------------------------------------------
def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    """A flat Responses function tool --> the chat shape."""
    if tool.get("type") != "function":
        raise BadRequest(f"tools[{i}].type {str(tool.get('type'))[:40]!r} is not supported: this server runs "
                         "no built-in tools; offer functions (type function) and run them in your code",
                         param="tools")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    """"auto" | "none" | "required" | {"type": "function", "name": ...} --> the chat form."""
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest('tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}',
                     param="tool_choice")


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` --> the chat route's response_format (json_schema's fields sit one level up here)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object", param="text")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return fmt
