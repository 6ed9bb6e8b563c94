"""Tool calling, engine-neutral: validating offered tools, rendering them and a conversation's calls and
results into chat messages, parsing a model's answer back into calls, and the grammar that constrains it.

Why here: both engines (shared/decoding/generation.py for transformers, the vLLM engine) and both doors
(gRPC in services/inference/requests.py, HTTP in services/inference/openai_api/) need the same rules, so a
call a client sees is the same whatever path served it.

Formats. A model's template that takes `tools` (Hugging Face `apply_chat_template(tools=...)`) renders them
its own way; every other model gets the family-neutral Hermes format: the tools listed as JSON in the system
turn inside `<tools></tools>`, calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, results
as `<tool_response>...</tool_response>` in a user turn (a role every template accepts). Everything rendered
here is message *content*, so shared/decoding/chat_template.py keeps any special token in a description, an
argument or a tool result as text (tests/security/test_control_tokens_all_paths.py).

Parsing is a small registry (`PARSERS`, picked by `parser_for(template)`) so more families can be added.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from shared.decoding.params import Grammar

MAX_TOOLS = 128
"""Tools one request may offer (OpenAI's own bound): each is rendered into the prompt and the grammar."""
MAX_DESCRIPTION_CHARS = 8192
MAX_SCHEMA_CHARS = 65536
"""A parameters schema's JSON text: bounds the grammar llguidance compiles per request."""
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICE_MODES = ("auto", "none", "required", "function")


class ToolError(ValueError):
    """A request's tools, tool_choice or tool messages are invalid; `param` names the field (HTTP 400 param,
    gRPC INVALID_ARGUMENT message)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolSpec:
    """One offered function."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    strict: bool = False

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI tool shape templates that take `tools=` expect."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text (as the OpenAI API returns it)."""

    id: str
    name: str
    arguments: str


def new_call_id(seed: str = "", k: int = 0) -> str:
    """`call_<24 characters>`: unguessable, so a tool message cannot answer a call it did not see. With a
    seed (the choice's interaction id, itself unguessable) the k-th call's id is derived from it, so the
    response and the captured Interaction (services/inference/requests.py) name a call alike."""
    if seed:
        return "call_" + hashlib.sha256(f"{seed}:{k}".encode()).hexdigest()[:24]
    return "call_" + secrets.token_urlsafe(18).replace("-", "a").replace("_", "b")


def parse_tool(name: str, description: str, parameters_json: str, strict: bool, index: int) -> ToolSpec:
    """One tool from its wire fields, validated (name, sizes, parameters an object JSON schema)."""
    where = f"tools[{index}]"
    if not NAME_RE.fullmatch(name or ""):
        raise ToolError(f"{where}.function.name must match [A-Za-z0-9_-]{{1,64}}; got {name!r}",
                        f"{where}.function.name")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ToolError(f"{where}.function.description is longer than {MAX_DESCRIPTION_CHARS} characters",
                        f"{where}.function.description")
    if len(parameters_json) > MAX_SCHEMA_CHARS:
        raise ToolError(f"{where}.function.parameters is larger than {MAX_SCHEMA_CHARS} characters",
                        f"{where}.function.parameters")
    try:
        params = json.loads(parameters_json) if parameters_json.strip() else {"type": "object", "properties": {}}
    except json.JSONDecodeError as e:
        raise ToolError(f"{where}.function.parameters is not JSON: {e}", f"{where}.function.parameters") from e
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ToolError(f"{where}.function.parameters must be a JSON schema of type object",
                        f"{where}.function.parameters")
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as e:
        raise ToolError(f"{where}.function.parameters is not a valid JSON schema: {e.message}",
                        f"{where}.function.parameters") from e
    return ToolSpec(name=name, description=description, parameters=params, strict=strict)


def check_tools(tools: Sequence[ToolSpec]) -> None:
    """Count and unique names (each tool was checked by `parse_tool`)."""
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools per request; got {len(tools)}", "tools")
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if t.name in seen:
            raise ToolError(f"tools[{i}]: the function name {t.name!r} is offered twice",
                            f"tools[{i}].function.name")
        seen.add(t.name)


def check_tool_choice(mode: str, function: str, tools: Sequence[ToolSpec]) -> None:
    """mode in auto|none|required|function; a named function must be one of the offered tools."""
    if mode not in TOOL_CHOICE_MODES:
        raise ToolError(f"tool_choice must be one of auto, none, required or a function; got {mode!r}",
                        "tool_choice")
    if mode in ("required", "function") and not tools:
        raise ToolError(f"tool_choice {mode!r} needs tools", "tool_choice")
    if mode == "function" and function not in {t.name for t in tools}:
        raise ToolError(f"tool_choice names {function!r}, which is not among the tools offered", "tool_choice")


def check_history(messages: Sequence[Mapping[str, Any]]) -> None:
    """Each tool message answers a call id an earlier assistant message made (so results are attributable)."""
    made: set[str] = set()
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or ():
            made.add(str(c["id"]))
        if m.get("role") == "tool":
            cid = str(m.get("tool_call_id") or "")
            if not cid:
                raise ToolError(f"messages[{i}]: a tool message needs tool_call_id", f"messages[{i}].tool_call_id")
            if cid not in made:
                raise ToolError(f"messages[{i}]: tool_call_id {cid!r} answers no earlier assistant tool call",
                                f"messages[{i}].tool_call_id")


# --------------------------------------------------------------------------------------------- rendering

def _hermes_system(tools: Sequence[ToolSpec]) -> str:
    listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return ("You may call one or more functions to assist with the user query. The functions are listed "
            f"inside <tools></tools>:\n<tools>\n{listed}\n</tools>\nTo call a function, answer with a JSON "
            "object of its name and arguments inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def format_call(name: str, arguments: str | Mapping[str, Any]) -> str:
    """One call as the Hermes text (the form the grammar produces and the parser reads)."""
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def render_hermes(messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> list[dict[str, str]]:
    """Messages with tool calls and results --> plain role/content messages any template renders.

    Tools join the first system turn (or open one); an assistant's calls follow its content; a run of tool
    results becomes one user turn of `<tool_response>` blocks (named by function, when given)."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = str(m.get("role", "")), str(m.get("content") or "")
        if role == "assistant" and m.get("tool_calls"):
            calls = [format_call(c["name"], c.get("arguments") or "{}") for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join([content, *calls] if content else calls)})
        elif role == "tool":
            block = "<tool_response>\n" + content + "\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": "1"})
        else:
            out.append({"role": role, "content": content})
    for m in out:
        m.pop("_tool", None)
    if tools:
        head = _hermes_system(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = out[0]["content"] + "\n\n" + head
        else:
            out.insert(0, {"role": "system", "content": head})
    return out


def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template renders `tools` itself (it reads the variable)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


# ---------------------------------------------------------------------------------------------- parsing

RawCall = tuple[str, Any]   # (name, arguments as parsed JSON)
Parser = Callable[[str], tuple[str, list[RawCall]]]

_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> tuple[str, list[RawCall]]:
    """Hermes / Qwen: `<tool_call>{"name":..,"arguments":{..}}</tool_call>` blocks; the rest is content.

    A block that is not such a JSON object stays in the content (the client sees what the model wrote)."""
    calls: list[RawCall] = []
    kept: list[str] = []
    pos = 0
    for m in _HERMES_BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append((obj["name"], args))
    tail = text[pos:]
    if calls and "<tool_call>" in tail:
        # an unterminated call after complete ones was cut by max_new_tokens: not content, not a call
        tail = tail[:tail.index("<tool_call>")]
    kept.append(tail)
    return "".join(kept).strip(), calls


PARSERS: dict[str, Parser] = {"hermes": parse_hermes}
"""Family name --> parser. Add a family by adding its parser here and a rule in `parser_for`."""


def parser_for(template: str | None) -> str:
    """The parser family of a model, from its chat template (Hermes / Qwen / SmolLM / the neutral format)."""
    return "hermes"


def might_be_call(text: str) -> bool:
    """Streaming: whether held-back text may still turn out to be a call (so it is not sent as content yet)."""
    s = text.lstrip()
    return s.startswith("<tool_call>"[: len(s)]) if s else True


def parse_answer(text: str, tools: Sequence[ToolSpec], family: str = "hermes", *,
                 parallel: bool = True, id_seed: str = "") -> tuple[str, list[ToolCall]]:
    """A model's answer --> (content, calls). A call to an unknown function, or (strict tools) one whose
    arguments fail the schema, is not returned as a call: its text stays content. `parallel=False`: at most
    the first call."""
    content, raw = PARSERS[family](text)
    by_name = {t.name: t for t in tools}
    calls: list[ToolCall] = []
    rejected: list[str] = []
    for name, args in raw:
        tool = by_name.get(name)
        ok = tool is not None and isinstance(args, dict)
        if ok and tool is not None and tool.strict:
            ok = jsonschema.Draft202012Validator(dict(tool.parameters)).is_valid(args)
        if ok and (parallel or not calls):
            calls.append(ToolCall(id=new_call_id(id_seed, len(calls)), name=name, arguments=json.dumps(args, ensure_ascii=False)))
        elif not ok:
            rejected.append(format_call(name, args if isinstance(args, dict) else {}))
    if rejected:
        content = "\n".join([content, *rejected]).strip()
    return content, calls


# ---------------------------------------------------------------------------------------------- grammar

def _lark_str(s: str) -> str:
    return json.dumps(s)


def tool_grammar(tools: Sequence[ToolSpec], mode: str, function: str = "", *,
                 parallel: bool = True, answer: Grammar | None = None) -> Grammar | None:
    """The Lark grammar (llguidance dialect) that constrains an answer, or None when unconstrained.

    required: one call (or several, `parallel`) to offered tools; function: exactly that one; auto with a
    strict tool: free text not starting with `<`, or calls whose arguments follow each function's schema
    (`%json{...}`). auto with an `answer` format (response_format json_object / json_schema): a JSON answer
    of that schema, or calls; an agent with tools and a typed output needs both, and either alone let a
    weak model write free text to its budget. none, or auto without strict tools or format: None."""
    if mode == "none" or not tools:
        return answer if mode == "none" else None
    offered = [t for t in tools if mode != "function" or t.name == function]
    if mode == "auto" and not any(t.strict for t in offered) and answer is None:
        return None
    rules = []
    for i, t in enumerate(offered):
        # whitespace fixed to json.dumps' separators: a weak model otherwise spends its tokens on blanks
        # inside the JSON (llguidance's x-guidance options), and the call reads like `format_call` writes it
        params = dict(t.parameters) or {"type": "object"}
        # a forced call's arguments are the ones the function declares: a schema that leaves
        # additionalProperties open (pydantic's, LangChain's) let a weak model append invented keys until its
        # token budget ran out, and the call never closed
        if "properties" in params and "additionalProperties" not in params:
            params["additionalProperties"] = False
        compact = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
                   **params}
        schema = json.dumps(compact, ensure_ascii=False, separators=(",", ":"))
        head = '<tool_call>\n{"name": "' + t.name + '", "arguments": '
        rules.append(f"call_{i}: {_lark_str(head)} %json {schema} {_lark_str(chr(125) + chr(10) + '</tool_call>')}")
    alts = " | ".join(f"call_{i}" for i in range(len(offered)))
    calls = 'call ("\\n" call)*' if parallel and mode != "function" else "call"
    text = "TEXT" if answer is None else "answer"
    start = f"start: {calls}" if mode != "auto" else f"start: {text} | {calls}"
    lines = [start, f"call: {alts}", *rules]
    if mode == "auto" and answer is None:
        lines.append(r"TEXT: /[^<](.|\n)*/ | /\s*/")
    elif mode == "auto" and answer is not None:
        lines.append(f"answer: %json {_answer_schema(answer)}")
    return Grammar(kind="lark", source="\n".join(lines) + "\n")


def _answer_schema(answer: Grammar) -> str:
    """The JSON schema a response format's grammar enforces, for embedding with `%json` (no whitespace
    between tokens, as shared/decoding/constraints.py compiles a response format on its own)."""
    if answer.kind not in ("json_schema", "json_object"):
        raise ValueError(f"an answer format combined with tools must be a JSON one; got {answer.kind!r}")
    schema = json.loads(answer.source) if answer.kind == "json_schema" else {"type": "object"}
    return json.dumps({"x-guidance": {"whitespace_flexible": False}, **schema}, ensure_ascii=False,
                      separators=(",", ":"))


def split_answer(text: str, finish_reason: str, tools: Sequence[ToolSpec], mode: str, *,
                 parallel: bool = True, id_seed: str = "") -> tuple[str, list[ToolCall], str]:
    """A choice's text and finish reason --> (content, calls, finish reason) as the doors return them:
    `tool_calls` when the answer made calls (OpenAI's finish reason), the text unchanged when no tools were
    offered or tool_choice is none."""
    if not tools or mode == "none":
        return text, [], finish_reason
    content, calls = parse_answer(text, tools, parallel=parallel, id_seed=id_seed)
    if not calls:
        return text, [], finish_reason
    # cut by the token limit, the answer keeps `length` (the client learns a call may be missing)
    return content, calls, "length" if finish_reason == "length" else "tool_calls"
