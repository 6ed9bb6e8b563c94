"""GenerateRequest / FeedbackRequest protos --> validated internal requests --> Interaction / FeedbackEvent.

Everything a caller can get wrong is checked here, each failure an `InvalidRequest` (INVALID_ARGUMENT)
whose message names the field, the bound and the value received. No network, no engine state: the
tokenizer and context window are passed in. At the end, the two waits of a request on its way through
the engine (`injected_delay`, `wait_result`), which turn deadlines and engine failures into call errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

from services.inference.engines.base import EngineError, RequestHandle
from services.inference.prompt import ServedPrompt, build_prompt, message_dict
from services.inference.settings import InferenceSettings
from shared.contracts.events import deterministic_id, make_envelope
from shared.decoding.constraints import MAX_SOURCE_BYTES, GrammarError, validate
from shared.decoding.params import GREEDY_BELOW, Grammar, SamplingConfig
from shared.decoding.tool_calls import (
    ToolError,
    ToolSpec,
    check_history,
    check_tool_choice,
    check_tools,
    parse_tool,
    split_answer,
    tool_grammar,
)
from shared.privacy.policy import Scan
from shared.proto.apprentice.v1 import common_pb2, events_pb2, inference_pb2
from shared.rpc.grpc_util import (
    TENANT_METADATA,
    InvalidRequest,
    PermissionDenied,
    ServiceError,
    Unavailable,
    metadata_value,
    remaining_s,
    require,
)
from shared.security.identity import Role, current_identity

ROLES = ("system", "user", "assistant", "tool")
FEEDBACK_KINDS = ("thumbs", "rating", "correction", "kpi")
MAX_TEMPERATURE = 5.0
SEED_MODULUS = 1 << 31          # seeds are reduced modulo 2^31 (torch generators take them safely)
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# --- tenancy and auth ------------------------------------------------------------------------------
def resolve_tenant(request_tenant: str, context: Any, settings: InferenceSettings) -> str:
    """The tenant a call acts for. A backend key acts for its own tenant only (a request or metadata
    naming another one is PERMISSION_DENIED); operators and services name the tenant (request field,
    else `x-apprentice-tenant`, else the default tenant), as does a caller of a server without keys."""
    md_tenant = metadata_value(context, TENANT_METADATA)
    identity = current_identity()
    if identity is not None and identity.role is Role.BACKEND:
        for claimed in (request_tenant, md_tenant):
            if claimed and claimed != identity.tenant:
                raise PermissionDenied(f"this key acts for tenant {identity.tenant!r}, not {claimed!r}")
        return identity.tenant
    tenant = request_tenant or md_tenant or settings.default_tenant
    require(bool(_TENANT_RE.match(tenant)),
            f"tenant {tenant[:80]!r} must be 1-128 characters of letters, digits, '.', '_' or '-'")
    return tenant


def stamp_principal(env: common_pb2.Envelope) -> common_pb2.Envelope:
    """Record on an event who caused it (the authenticated caller of the current call)."""
    identity = current_identity()
    if identity is not None:
        env.principal.CopyFrom(identity.to_principal())
    return env


# --- Generate ------------------------------------------------------------------------------------
PromptPrivacy = Literal["unchecked", "as_sent", "redacted", "failed"]


@dataclass
class PreparedRequest:
    tenant: str
    session_id: str
    task: str
    messages: list[common_pb2.ChatMessage]
    """The caller's messages as sent (a raw prompt: one user message), what the privacy scans read; what is
    served and recorded is `prompt`."""
    raw_prompt: bool
    prompt: ServedPrompt
    """The one prompt the engine receives and every choice's Interaction records (services/inference/prompt.py):
    built here from the request, rebuilt by the redaction and the knowledge steps from their inputs."""
    sampling: SamplingConfig
    effective: common_pb2.SamplingParams   # what was actually used (defaults filled in), for the event
    no_capture: bool
    principal: common_pb2.Principal | None = None
    """Who asked (recorded on the captured interaction); set by the server from the caller's identity."""
    no_knowledge: bool = False
    knowledge: list[events_pb2.KnowledgeRef] = field(default_factory=list)
    """The knowledge items in the context (services/inference/knowledge.py): `prompt.notes` are their texts."""
    tools: list[ToolSpec] = field(default_factory=list)
    """The functions offered (shared/decoding/tool_calls.py); the answer is parsed for calls to them, and the
    grammar built from them. `prompt.tools` are the same as rendered and recorded (redacted when needed)."""
    tool_choice: str = "auto"
    response_format: common_pb2.ResponseFormat | None = None
    """The answer's required shape (enforced through `sampling.grammar`), captured on the Interaction."""
    parallel_tool_calls: bool = True
    prompt_scans: tuple[Scan, ...] | None = None
    """The personal-data scan of each of `messages`, made once per request by its first reader
    (services/inference/privacy.py): the edge's `reject` decision and the capture's redaction of every
    choice read the same scans, so no message goes through the detector twice."""
    tool_scans: tuple[Scan, ...] | None = None
    """The same for each offered tool's definition."""
    max_new_tokens_asked: int = 0
    """The caller's sampling.max_new_tokens (0 = the server's default, shrunk to what fits)."""
    prompt_privacy: PromptPrivacy = "unchecked"
    """What the capture edge did to `prompt` before it was served (services/inference/privacy.py
    `redact_prompt`): kept as sent, redacted, or served as sent after the detector failed (its captured
    interactions then keep no text). The capture refuses to record a prompt that was never checked."""

    @property
    def prompt_text(self) -> str:
        return self.prompt.text

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.ids


class Completion(NamedTuple):
    """A served unary call: samples with their interaction ids, and the version that produced them."""

    samples: list[Any]
    ids: list[str]
    version: str
    canary: bool


def check_sampling(sp: common_pb2.SamplingParams, settings: InferenceSettings) -> None:
    """Range checks that do not need the tokenizer."""
    require(sp.max_new_tokens >= 0,
            f"sampling.max_new_tokens must be >= 0 (0 = server default {settings.default_max_new_tokens}); "
            f"got {sp.max_new_tokens}")
    require(sp.max_new_tokens <= settings.max_new_tokens_limit,
            f"sampling.max_new_tokens must be <= {settings.max_new_tokens_limit}; got {sp.max_new_tokens}")
    require(math.isfinite(sp.temperature) and 0.0 <= sp.temperature <= MAX_TEMPERATURE,
            f"sampling.temperature must be within [0, {MAX_TEMPERATURE:g}] (0 = greedy); got {sp.temperature:g}")
    require(math.isfinite(sp.top_p) and 0.0 <= sp.top_p <= 1.0,
            f"sampling.top_p must be within [0, 1] (0 or 1 = off); got {sp.top_p:g}")
    require(sp.top_k >= 0, f"sampling.top_k must be >= 0 (0 = off); got {sp.top_k}")
    require(0 <= sp.n <= settings.max_n, f"sampling.n must be within 1..{settings.max_n} (0 = 1); got {sp.n}")
    require(sp.n <= 1 or sp.temperature >= GREEDY_BELOW,
            f"sampling.n = {sp.n} needs temperature > 0 (at least {GREEDY_BELOW:g}): greedy samples would all be "
            "identical")
    require(sp.seed >= 0, f"sampling.seed must be >= 0 (0 = unseeded); got {sp.seed}")
    require(len(sp.stop) <= settings.max_stop_strings,
            f"sampling.stop: at most {settings.max_stop_strings} strings; got {len(sp.stop)}")
    for i, s in enumerate(sp.stop):
        require(0 < len(s) <= settings.max_stop_length,
                f"sampling.stop[{i}] must be 1-{settings.max_stop_length} characters; got {len(s)}")


class ContextLengthExceeded(InvalidRequest):
    """The prompt (or prompt + the completion asked for) does not fit the model's context window.

    INVALID_ARGUMENT over gRPC, with a message that says so; the HTTP door (openai_api/errors.py) answers
    OpenAI's shape for it, `code: "context_length_exceeded"` with `param` the field at fault, which the
    OpenAI SDKs raise as BadRequestError and agent frameworks recognise (they trim history on it)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ResponseFormatError(InvalidRequest):
    """An invalid `response_format` (INVALID_ARGUMENT; HTTP 400 with param response_format)."""

    param = "response_format"


RESPONSE_FORMATS = ("", "text", "json_object", "json_schema")


def response_grammar(rf: common_pb2.ResponseFormat, scope: str = "") -> Grammar | None:
    """The grammar that enforces `rf` (shared/decoding/constraints.py), None for text. json_schema is enforced
    whether or not `strict` is set (a constrained answer always parses); the schema must be JSON, an object
    schema, at most MAX_SOURCE_BYTES, and compile: otherwise ResponseFormatError with llguidance's message."""
    if rf.type not in RESPONSE_FORMATS:
        raise ResponseFormatError(f"response_format.type must be one of text, json_object, json_schema; "
                                  f"got {rf.type[:40]!r}")
    if rf.type in ("", "text"):
        return None
    if rf.type == "json_object":
        grammar = Grammar("json_object", scope=scope)
    else:
        if not rf.schema_json:
            raise ResponseFormatError("response_format.json_schema.schema is required")
        if len(rf.schema_json.encode()) > MAX_SOURCE_BYTES:
            raise ResponseFormatError(f"response_format.json_schema.schema is larger than {MAX_SOURCE_BYTES} bytes")
        try:
            schema = json.loads(rf.schema_json)
        except ValueError as e:
            raise ResponseFormatError(f"response_format.json_schema.schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            got = (f"type {json.dumps(schema.get('type'))[:64]}" if isinstance(schema, dict)
                   else f"a JSON {type(schema).__name__}")
            raise ResponseFormatError('response_format.json_schema.schema must be an object schema '
                                      f'({{"type": "object", ...}}); got {got}')
        grammar = Grammar("json_schema", rf.schema_json, scope=scope)
    try:
        validate(grammar)
    except GrammarError as e:
        raise ResponseFormatError(f"response_format.json_schema.schema cannot be enforced: {e}") from None
    return grammar


class ToolRequestError(InvalidRequest):
    """Invalid tools / tool_choice / tool messages; `param` names the field (the HTTP door's 400 param)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def prepare(req: inference_pb2.GenerateRequest, tenant: str, settings: InferenceSettings, tokenizer: Any,
            context_window: int, new_session_id: str) -> PreparedRequest:
    """Validate a GenerateRequest and turn it into prompt tokens + sampling parameters."""
    has_messages, has_prompt = len(req.messages) > 0, bool(req.prompt)
    require(has_messages or has_prompt, "give either `messages` (chat) or `prompt` (raw text); both are empty")
    require(not (has_messages and has_prompt), "give either `messages` or `prompt`, not both")
    require(len(req.session_id) <= 256, f"session_id must be at most 256 characters; got {len(req.session_id)}")
    require(len(req.task) <= 128, f"task must be at most 128 characters; got {len(req.task)}")
    check_sampling(req.sampling, settings)
    answer_grammar = response_grammar(req.response_format, scope=tenant)     # compile cache: per tenant

    if has_messages:
        require(len(req.messages) <= settings.max_messages,
                f"messages: at most {settings.max_messages}; got {len(req.messages)}")
        chars = 0
        for i, m in enumerate(req.messages):
            require(m.role in ROLES, f"messages[{i}].role must be one of {', '.join(ROLES)}; got {m.role!r}")
            require(bool(m.content) or (m.role == "assistant" and len(m.tool_calls) > 0),
                    f"messages[{i}].content is empty")
            chars += len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
        require(chars <= settings.max_prompt_chars,
                f"messages hold {chars} characters; the limit is {settings.max_prompt_chars}")
        messages = list(req.messages)
        tools, tool_choice, tool_grammar_ = prepare_tools(req, answer_grammar)
        try:
            # special tokens written inside a message's content stay text: only the template's own role
            # markers are control tokens, so the role whitelist above cannot be bypassed
            prompt = build_prompt(tokenizer, messages, tools)
        except Exception as e:  # noqa: BLE001 - a template error is the request's shape, not a server fault
            raise InvalidRequest(f"messages cannot be rendered with this model's chat template: {e}; "
                                 "send a raw `prompt` instead") from e
    else:
        require(len(req.prompt) <= settings.max_prompt_chars,
                f"prompt is {len(req.prompt)} characters; the limit is {settings.max_prompt_chars}")
        require(len(req.tools) == 0, "tools need `messages` (chat); a raw `prompt` cannot offer tools")
        tools, tool_choice, tool_grammar_ = [], "none", None
        messages = [common_pb2.ChatMessage(role="user", content=req.prompt)]
        # a raw prompt is text too: writing `<|im_start|>system` into it makes no role token
        prompt = build_prompt(tokenizer, messages, raw=True)
    prompt_ids = prompt.ids
    require(len(prompt_ids) > 0, "the prompt encodes to zero tokens")
    sp = req.sampling
    room = _room(len(prompt_ids), sp.max_new_tokens, context_window, has_prompt)
    max_new = sp.max_new_tokens or min(settings.default_max_new_tokens, room)
    top_p = sp.top_p if 0 < sp.top_p < 1 else 1.0
    seed = sp.seed % SEED_MODULUS if sp.seed else None
    n = max(1, sp.n)
    if tool_grammar_ is not None:
        tool_grammar_ = dataclasses.replace(tool_grammar_, scope=tenant)
    sampling = SamplingConfig(max_new_tokens=max_new, temperature=float(sp.temperature), top_p=float(top_p),
                              top_k=int(sp.top_k), stop=tuple(sp.stop), seed=seed, n=n,
                              grammar=tool_grammar_ or answer_grammar)
    effective = common_pb2.SamplingParams(max_new_tokens=max_new, temperature=sp.temperature, top_p=top_p,
                                          top_k=sp.top_k, stop=list(sp.stop), seed=sp.seed, n=n)
    return PreparedRequest(tenant=tenant, session_id=req.session_id or new_session_id, task=req.task,
                           messages=messages, raw_prompt=has_prompt, prompt=prompt, sampling=sampling,
                           effective=effective, max_new_tokens_asked=sp.max_new_tokens,
                           no_capture=req.no_capture, no_knowledge=req.no_knowledge, tools=tools,
                           tool_choice=tool_choice, parallel_tool_calls=not req.no_parallel_tool_calls,
                           response_format=req.response_format)


def _room(prompt_tokens: int, asked: int, context_window: int, raw: bool, why: str = "") -> int:
    """The new tokens that fit after a prompt of `prompt_tokens`; ContextLengthExceeded when the prompt leaves
    none, or less than the `asked` sampling.max_new_tokens (0 = the server's default, which shrinks to fit)."""
    field_name = "prompt" if raw else "messages"
    if prompt_tokens >= context_window:
        raise ContextLengthExceeded(
            f"context length exceeded: the prompt is {prompt_tokens} tokens{why}; the context window is "
            f"{context_window} (prompt + completion must fit): shorten the {field_name}", field_name)
    room = context_window - prompt_tokens
    if asked and asked > room:
        raise ContextLengthExceeded(
            f"context length exceeded: prompt ({prompt_tokens} tokens{why}) + sampling.max_new_tokens "
            f"({asked}) exceeds the context window ({context_window}); at most {room} new tokens fit", field_name)
    return room


def fit_completion(p: PreparedRequest, context_window: int, why: str) -> None:
    """After a step that rebuilt `p.prompt` longer (placeholders can take more tokens than the values they
    replace): a server-default completion length shrinks to the room left; an asked one that no longer fits,
    or a prompt that fills the window, is ContextLengthExceeded (`why` says what changed the prompt)."""
    room = _room(len(p.prompt_ids), p.max_new_tokens_asked, context_window, p.raw_prompt, why)
    if p.sampling.max_new_tokens > room:
        p.sampling = dataclasses.replace(p.sampling, max_new_tokens=room)
        p.effective.max_new_tokens = room


def prepare_tools(req: inference_pb2.GenerateRequest, answer: Grammar | None = None) -> tuple[list[ToolSpec], str, Any]:
    """The request's tools, tool_choice and tool messages validated once for both doors (INVALID_ARGUMENT
    over gRPC, 400 with `param` over HTTP), and the grammar that enforces tool_choice / strict tools (with
    the response format `answer` when the model may answer instead of calling)."""
    try:
        tools = [parse_tool(t.name, t.description, t.parameters_json, t.strict, i) for i, t in enumerate(req.tools)]
        check_tools(tools)
        mode = req.tool_choice.mode or "auto"
        check_tool_choice(mode, req.tool_choice.function, tools)
        check_history([message_dict(m) for m in req.messages])
    except ToolError as e:
        raise ToolRequestError(str(e), e.param) from e
    return tools, mode, tool_grammar(tools, mode, req.tool_choice.function,
                                     parallel=not req.no_parallel_tool_calls, answer=answer)


def interaction_event(p: PreparedRequest, sample: Any, *, interaction_id: str, group_id: str, index: int,
                      model: str, version: str, canary: bool, pod: str, latency_ms: float,
                      trace_id: str) -> events_pb2.Interaction:
    """One served choice --> its Interaction event (event id derived from the interaction id, so a
    re-emission is recognisably the same event)."""
    env = make_envelope(p.tenant, source=f"inference/{pod}", trace_id=trace_id,
                        event_id=deterministic_id("interaction", interaction_id))
    if p.principal is not None:
        env.principal.CopyFrom(p.principal)
    # the calls as the caller got them (ids derived from the interaction id, shared/decoding/tool_calls.py)
    _, calls, _ = split_answer(sample.text, sample.finish_reason, p.tools, p.tool_choice,
                               parallel=p.parallel_tool_calls, id_seed=interaction_id)
    # the prompt as served (services/inference/prompt.py): its messages, tools, text and ids, byte for byte
    served = p.prompt
    return events_pb2.Interaction(
        tools=[common_pb2.Tool(name=t.name, description=t.description, strict=t.strict,
                               parameters_json=json.dumps(dict(t.parameters))) for t in served.tools],
        response_tool_calls=[common_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls],
        envelope=env, interaction_id=interaction_id, session_id=p.session_id, task=p.task, model=model,
        policy_version=version, messages=served.messages, prompt_text=served.text,
        prompt_token_ids=served.ids, sampling=p.effective, response_text=sample.text,
        response_token_ids=sample.token_ids, response_logprobs=sample.logprobs,
        response_logprobs_t1=sample.logprobs_t1, finish_reason=sample.finish_reason, latency_ms=latency_ms,
        group_id=group_id, sample_index=index, group_size=p.sampling.n, canary=canary, serving_pod=pod,
        raw_prompt=p.raw_prompt, knowledge_items=p.knowledge, response_format=p.response_format,
        knowledge_version=",".join(sorted({f"{r.key}@{r.snapshot_version}" for r in p.knowledge})))


# --- Feedback ------------------------------------------------------------------------------------
def feedback_event(req: inference_pb2.FeedbackRequest, tenant: str, pod: str,
                   now: datetime | None = None) -> events_pb2.FeedbackEvent:
    """Validate a FeedbackRequest --> FeedbackEvent. The event id is a hash of the feedback's content
    and time, so a client retrying the same submission produces the same event."""
    now = now or datetime.now(UTC)
    require(bool(req.interaction_id), "interaction_id is required")
    require(len(req.interaction_id) <= 128, f"interaction_id must be at most 128 characters; got {len(req.interaction_id)}")
    require(req.kind in FEEDBACK_KINDS, f"kind must be one of {', '.join(FEEDBACK_KINDS)}; got {req.kind!r}")
    require(math.isfinite(req.value), f"value must be a finite number; got {req.value}")
    require(len(req.comment) <= 20_000, f"comment must be at most 20000 characters; got {len(req.comment)}")
    require(len(req.kpi_name) <= 128, f"kpi_name must be at most 128 characters; got {len(req.kpi_name)}")
    if req.kind == "thumbs":
        require(req.value in (1.0, -1.0), f"thumbs feedback needs value +1 or -1; got {req.value:g}")
    elif req.kind == "rating":
        require(1.0 <= req.value <= 5.0, f"rating feedback needs value within [1, 5]; got {req.value:g}")
    elif req.kind == "correction":
        require(bool(req.comment.strip()), "correction feedback needs the corrected answer in `comment`")
    elif req.kind == "kpi":
        require(bool(req.kpi_name), "kpi feedback needs `kpi_name`")
    if req.HasField("occurred_at"):
        ts = req.occurred_at
        # ToDatetime raises ValueError (an INTERNAL error) on nanos outside [0, 1e9) or a year outside 1..9999
        require(0 <= ts.nanos < 1_000_000_000 and -62135596800 <= ts.seconds <= 253402300799,
                f"occurred_at is not a valid timestamp (seconds={ts.seconds}, nanos={ts.nanos})")
        when = ts.ToDatetime(tzinfo=UTC)
        require(when <= now + timedelta(minutes=5), f"occurred_at {when.isoformat()} is in the future")
    else:
        when = now
    event_id = deterministic_id("feedback", tenant, req.interaction_id, req.kind, req.kpi_name, repr(req.value),
                                req.comment, when.isoformat())
    env = stamp_principal(make_envelope(tenant, source=f"inference/{pod}", event_id=event_id, occurred_at=when))
    return events_pb2.FeedbackEvent(envelope=env, interaction_id=req.interaction_id, kind=req.kind,
                                    value=req.value, comment=req.comment, kpi_name=req.kpi_name)


def injected_delay(seconds: float, context: Any) -> None:
    """`fault_delay_s` (tests, chaos drills): hold the request like a slow pod would, but never past the
    caller's deadline, after which the engine answers DEADLINE_EXCEEDED at once."""
    remaining = remaining_s(context)
    wait = seconds if remaining is None else max(0.0, min(seconds, remaining))
    time.sleep(wait)


def wait_result(handle: RequestHandle, context: Any) -> list[Any]:
    """The samples; an engine failure or an engine that outlives the call's deadline is an error."""
    remaining = remaining_s(context)
    try:
        return handle.result(timeout=None if remaining is None else remaining + 5.0)
    except TimeoutError:
        handle.cancel()
        raise Unavailable("generation did not finish before the deadline") from None
    except EngineError as e:
        raise ServiceError(str(e)) from e
