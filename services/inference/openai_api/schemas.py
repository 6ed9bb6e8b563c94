"""OpenAI request bodies --> typed requests --> the `GenerateRequest` proto that the gRPC door also takes.

Only what HTTP adds is checked here (JSON types, OpenAI's own rules such as `top_logprobs` needing
`logprobs`, parameters Apprentice does not implement); every range and size check happens once, in
`services/inference/requests.py`, on the proto built here, so both doors refuse the same requests with
the same messages.

OpenAI's defaults apply where they differ from the proto's: temperature and top_p 1 (the proto's 0 means
greedy / off), `max_tokens` 16 on `/v1/completions` (the server default on chat). Apprentice extensions,
sent as extra body fields (`extra_body=` in the SDKs): `session_id`, `task`, `tenant`, `no_capture`,
`no_knowledge`, `top_k`. `user` becomes the session id when no `session_id` is given.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.inference.openai_api.errors import BadRequest, from_validation
from shared.proto.apprentice.v1 import common_pb2, inference_pb2

INT32_MAX = 2**31 - 1
Int32 = Annotated[int, Field(ge=-(2**31), le=INT32_MAX)]
SEED_SPACE = 2**31
"""OpenAI seeds are any int64 and 0 is a seed; the proto's 0 means "unseeded" and the engine reduces seeds
modulo 2^31, so a seed s is sent as s mod 2^31, with 0 sent as 2^31 (the same generator)."""

MAX_TOP_LOGPROBS = 20
"""OpenAI's bound on `top_logprobs`."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) default `max_tokens` for `/v1/completions`."""

# Parameters Apprentice does not implement: accepted only at a value that means "not used".
_INACTIVE: tuple[Any, ...] = (None, [], {}, 0, 0.0, False, "none", "text", {"type": "text"}, ["text"])
_CHAT_UNSUPPORTED = ("logit_bias",
                     "frequency_penalty", "presence_penalty", "audio", "modalities", "prediction",
                     "web_search_options")
_COMPLETION_UNSUPPORTED = ("logit_bias", "frequency_penalty", "presence_penalty", "suffix", "echo")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class Extensions(BaseModel):
    """The Apprentice extensions every generating route takes (`extra_body=` in the SDKs)."""

    model_config = ConfigDict(extra="ignore")

    session_id: str = ""
    task: str = ""
    tenant: str = ""
    no_capture: bool = False
    no_knowledge: bool = False
    top_k: Int32 = 0


class _Common(Extensions):
    """Fields both completion endpoints share."""

    model: str = ""
    n: int = Field(1, ge=1, le=INT32_MAX)
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling(self, max_new_tokens: int) -> common_pb2.SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        seed = 0 if self.seed is None else (self.seed % SEED_SPACE or SEED_SPACE)
        return common_pb2.SamplingParams(
            max_new_tokens=max_new_tokens, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k, stop=stop, seed=seed, n=self.n)

    def generate_request(self, **content: Any) -> inference_pb2.GenerateRequest:
        return inference_pb2.GenerateRequest(
            **content, tenant=self.tenant, session_id=self.session_id or self.user or "", task=self.task,
            no_capture=self.no_capture, no_knowledge=self.no_knowledge)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


R = TypeVar("R", bound=_Common)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str = ""


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    type: str = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = False


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = "function"
    function: FunctionIn


def _tool_choice(choice: Any) -> common_pb2.ToolChoice:
    """OpenAI's tool_choice (and legacy function_call): "auto" | "none" | "required" | a named function."""
    if choice is None:
        return common_pb2.ToolChoice()
    if isinstance(choice, str):
        return common_pb2.ToolChoice(mode=choice)
    if isinstance(choice, dict):
        fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return common_pb2.ToolChoice(mode="function", function=fn["name"])
    raise BadRequest('tool_choice must be "auto", "none", "required" or {"type": "function", "function": '
                     '{"name": ...}}', param="tool_choice")


class ChatCompletionRequest(_Common):
    messages: list[ChatMessageIn]
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolIn] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[FunctionIn] | None = None
    """Legacy: the same as tools of type function."""
    function_call: Any = None
    """Legacy: the same as tool_choice."""

    response_format: Any = None
    """OpenAI's response_format: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}; enforced by constrained decoding (services/inference/requests.py)."""

    def _response_format(self) -> common_pb2.ResponseFormat:
        rf = self.response_format
        if rf is None:
            return common_pb2.ResponseFormat()
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise BadRequest('response_format must be {"type": "text"}, {"type": "json_object"} or {"type": '
                             '"json_schema", "json_schema": {"name": ..., "schema": {...}}}', param="response_format")
        if rf["type"] != "json_schema":
            return common_pb2.ResponseFormat(type=rf["type"])
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise BadRequest("response_format.json_schema.schema must be a JSON object", param="response_format")
        return common_pb2.ResponseFormat(type="json_schema", schema_json=json.dumps(js["schema"]),
                                         name=str(js.get("name") or "")[:64], strict=bool(js.get("strict")))

    def _tools(self) -> list[common_pb2.Tool]:
        fns = [t.function for t in self.tools or []] + list(self.functions or [])
        for i, t in enumerate(self.tools or []):
            if t.type != "function":
                raise BadRequest(f"tools[{i}].type must be function; got {t.type[:40]!r}", param="tools")
        return [common_pb2.Tool(name=f.name, description=f.description, strict=bool(f.strict),
                                parameters_json=json.dumps(f.parameters) if f.parameters is not None else "")
                for f in fns]

    def to_proto(self) -> inference_pb2.GenerateRequest:
        """System/developer/user/assistant/tool turns with text content; `developer` is OpenAI's newer name
        for `system`; assistant tool calls and tool results are checked by the shared checks
        (services/inference/requests.py)."""
        messages = []
        for i, m in enumerate(self.messages):
            if isinstance(m.content, list):
                for j, part in enumerate(m.content):
                    if part.type != "text":
                        raise BadRequest(f"messages[{i}].content[{j}]: only text parts are supported; got a "
                                         f"{part.type[:40]!r} part", param="messages")
                content = "".join(part.text for part in m.content)
            else:
                content = m.content or ""
            calls = [common_pb2.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                     for c in m.tool_calls or []]
            messages.append(common_pb2.ChatMessage(role="system" if m.role == "developer" else m.role,
                                                   content=content, tool_calls=calls,
                                                   tool_call_id=m.tool_call_id or "", name=m.name or ""))
        max_new = self.max_completion_tokens or self.max_tokens or 0
        choice = _tool_choice(self.tool_choice if self.tool_choice is not None else self.function_call)
        return self.generate_request(messages=messages, sampling=self.sampling(max_new), tools=self._tools(),
                                     tool_choice=choice, no_parallel_tool_calls=self.parallel_tool_calls is False,
                                     response_format=self._response_format())


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: Int32 | None = None

    def to_proto(self) -> inference_pb2.GenerateRequest:
        """One text prompt, sent raw (no chat template)."""
        prompt = self.prompt
        if isinstance(prompt, list):
            if not (len(prompt) == 1 and isinstance(prompt[0], str)):
                raise BadRequest("prompt: give one text prompt (a string, or a list holding one string); "
                                 "token-id prompts and batches of prompts are not supported", param="prompt")
            prompt = prompt[0]
        assert isinstance(prompt, str)
        if self.best_of is not None and self.best_of != self.n:
            raise BadRequest(f"best_of ({self.best_of}) other than n ({self.n}) is not supported", param="best_of")
        max_new = self.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
        return self.generate_request(prompt=prompt, sampling=self.sampling(max_new))


def _refuse_unsupported(raw: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if name in raw and raw[name] not in _INACTIVE:
            raise BadRequest(f"{name} is not supported by this server (Apprentice serves plain text "
                             "generation)", param=name)


def parse_chat(raw: Any) -> ChatCompletionRequest:
    req = _parse(ChatCompletionRequest, raw, "chat completion request", _CHAT_UNSUPPORTED)
    if req.top_logprobs and not req.logprobs:
        raise BadRequest("top_logprobs needs logprobs set to true", param="top_logprobs")
    return req


def parse_completion(raw: Any) -> CompletionRequest:
    return _parse(CompletionRequest, raw, "completion request", _COMPLETION_UNSUPPORTED)


def _parse(model: type[R], raw: Any, what: str, unsupported: tuple[str, ...]) -> R:
    if not isinstance(raw, dict):
        raise BadRequest(f"the body must be a JSON object ({what}); got {type(raw).__name__}")
    _refuse_unsupported(raw, unsupported)
    try:
        req = model.model_validate(raw)
    except ValidationError as e:
        raise from_validation(e, what) from None
    if req.stream_options is not None and not req.stream:
        raise BadRequest("stream_options is only allowed when stream is true", param="stream_options")
    return req


def parse_feedback(raw: Any) -> inference_pb2.FeedbackRequest:
    """`/v1/feedback`: the JSON form of `FeedbackRequest` (snake_case or camelCase names, `occurred_at` as
    RFC 3339 text); the shared checks then validate it as they do a gRPC one."""
    if not isinstance(raw, dict):
        raise BadRequest(f"the body must be a JSON object (feedback request); got {type(raw).__name__}")
    try:
        return json_format.ParseDict(raw, inference_pb2.FeedbackRequest())
    except json_format.ParseError as e:
        raise BadRequest(f"feedback request: {e}") from None
