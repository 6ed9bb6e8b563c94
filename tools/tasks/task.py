"""Task file (YAML) --> a validated `Task`: facts, paraphrased questions, answer checks, corrections.

A task is data, not code, so a user can write their own (format in tools/demo/README.md). The answer
checks are rule-grader entries (`shared/grading`), the same rules the grader and the eval gate apply.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared import yaml_errors
from shared.grading.rules import RuleResult, grade_rule, parse_rule_spec
from shared.privacy.business import ADDRESSES, EMAILS, NAMES, PHONES, URLS, clean_names, clean_values

TASKS_DIR = Path(__file__).resolve().parent


class TaskError(ValueError):
    """The task file is invalid; the message says where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fact(_Strict):
    id: str
    fact: str
    """The knowledge a human agent has and the base model lacks."""
    answer_check: dict[str, Any]
    """A rule grader entry (type contains / regex / exact / ...) deciding the KPI."""
    correction: str
    """What a human agent writes back when the answer is wrong (the feedback text)."""
    questions: list[str] = Field(min_length=2)


class OODItem(_Strict):
    question: str
    check: dict[str, Any]


# Names that travel as Kafka keys, gRPC fields and grader-config entries: the inference service's tenant
# rule, and the knowledge key `tenant/task` must stay splittable (no '/').
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class KPI(_Strict):
    name: str = Field(default="resolved", pattern=NAME_RE)
    """The KPI name the product backend reports (`FeedbackRequest.kpi_name`); also the grader's component."""
    description: str = ""
    feedback_window_s: float = Field(default=300.0, gt=0, le=7 * 24 * 3600)
    """How long the grader waits for the KPI before it gives up on an interaction (no signal)."""


class Tool(_Strict):
    """A lookup the product backend runs when the reply asks for it, under a deadline. How the backend
    counts a time-out (`on_timeout`) is the KPI mapping: "misrouted" is the honest one (the customer was
    not helped); "routed" is the loophole production systems hit (a ticket whose lookup timed out is handed
    to a human and the dashboard counts it as routed), which a policy can learn to trigger on purpose."""

    name: str = Field(default="order_lookup", pattern=NAME_RE)
    kind: Literal["regex", "function"] = "regex"
    """`regex`: the reply's text "calls" the lookup (`call_pattern`); `function`: a real function tool the
    agent calls through the OpenAI door's `tools` (an agent task, `agent:`), run by the backend."""
    call_pattern: str = ""
    """A regex on the reply (searched, case-sensitive unless the pattern says otherwise): a match calls the tool."""
    description: str = ""
    """`function` tools: the description the model reads (the function tool's docstring)."""
    deadline_s: float = Field(default=0.3, gt=0, le=60)
    latency_s: tuple[float, float] = (0.05, 1.5)
    """The simulated lookup service's latency, uniform in this range: above `deadline_s` it times out."""
    on_timeout: Literal["misrouted", "routed"] = "misrouted"
    timeout_kpi: str = Field(default="tool_timeout", pattern=NAME_RE)
    """The telemetry KPI the backend reports (value 1) when the lookup times out, beside the outcome KPI."""

    @model_validator(mode="after")
    def _valid(self) -> Tool:
        if self.kind == "regex" and not self.call_pattern:
            raise ValueError("tool.call_pattern is required for a regex tool")
        try:
            re.compile(self.call_pattern)
        except re.error as e:
            raise ValueError(f"tool.call_pattern is not a valid regex: {e}") from None
        if not 0 <= self.latency_s[0] <= self.latency_s[1]:
            raise ValueError("tool.latency_s must be [low, high] with 0 <= low <= high")
        return self

    def called(self, text: str) -> bool:
        """Whether the reply's text calls a regex tool (a function tool is called only by a tool call)."""
        return self.kind == "regex" and re.search(self.call_pattern, text) is not None


class AgentSpec(_Strict):
    """An agent task: simulated users talk to an agent built with a real agent framework (the OpenAI Agents
    SDK, `tools/demo/agent_users.py`) through the stack's OpenAI-compatible HTTP door; its tool is the task's
    `function` tool, run by the simulated backend under the deadline."""

    framework: Literal["openai_agents"] = "openai_agents"
    api: Literal["chat_completions", "responses"] = "chat_completions"
    """Which door the SDK calls: `/v1/chat/completions` (OpenAIChatCompletionsModel) or `/v1/responses`."""
    max_turns: int = Field(default=4, ge=1, le=16)
    """The agent loop's bound on model calls per session (a session that runs out is a misroute)."""
    tool_choice: Literal["auto", "required"] = "auto"
    """The first model call's `tool_choice`; `required` makes every session call the tool once (the SDK
    resets it to auto after the call, so the agent then answers): the tests' way to drive the loop."""


class BusinessDataSpec(_Strict):
    """The business's own public data, kept by redaction in the tenant's captured text and knowledge
    (shared/privacy/business.py): exactly these values, written out (no patterns)."""

    names: list[str] = Field(default_factory=list)
    """Products, places, staff who speak for it (the same as the task's `business_names:`)."""
    phones: list[str] = Field(default_factory=list)
    """Its phone numbers ("+44 800 414 2277": the international form also keeps "0800 414 2277")."""
    emails: list[str] = Field(default_factory=list)
    """Its e-mail addresses ("found@trailmate.co.uk")."""
    addresses: list[str] = Field(default_factory=list)
    """Its street addresses ("12 Harbour Road, Leith, Edinburgh EH6 6LX")."""
    urls: list[str] = Field(default_factory=list)
    """Its web addresses ("https://trailmate.co.uk/returns")."""

    @field_validator("names", "phones", "emails", "addresses", "urls")
    @classmethod
    def _values_valid(cls, v: list[str], info: ValidationInfo) -> list[str]:
        return list(clean_values(str(info.field_name), v))

    def declaration(self) -> dict[str, list[str]]:
        """{kind: values}, every kind (shared/privacy/business.py `KINDS`)."""
        return {NAMES: self.names, PHONES: self.phones, EMAILS: self.emails, ADDRESSES: self.addresses,
                URLS: self.urls}


class Task(_Strict):
    name: str = Field(pattern=NAME_RE)
    tenant: str = Field(default="demo", pattern=NAME_RE)
    task: str = Field(default="support", pattern=NAME_RE)
    system_prompt: str = ""
    kpi: KPI = KPI()
    held_out_per_fact: int = Field(default=2, ge=1)
    facts: list[Fact] = Field(min_length=1)
    out_of_distribution: list[OODItem] = Field(default_factory=list)
    max_new_tokens: int | None = Field(default=None, ge=1, le=4096)
    """The product's cap on a reply for this task (a router answers with a team name), for the deployment
    and the evaluation alike: the demo's budget (48 new tokens; 24 with --quick) within it. None = no cap
    of the task's own (`null` in a variant lifts its base's)."""
    tool: Tool | None = None
    """A backend lookup the reply can trigger (the reward-hack variant of the routing task)."""
    agent: AgentSpec | None = None
    """Users talk to an agent whose `function` tool the backend runs (`tools/demo/agent_users.py`)."""
    business_names: list[str] = Field(default_factory=list)
    """Names that are part of the business (products, places, staff who speak for it): redaction keeps them
    in the tenant's captured text and knowledge (shared/privacy/business.py). Optional: `task_config` also adds
    the names the detector finds in the task's own business text (system prompt, facts, corrections). The same
    as `business_data.names`."""
    business_data: BusinessDataSpec = BusinessDataSpec()
    """The business's public data of every kind (names, phones, emails, addresses, urls), kept by redaction.
    Optional: `task_config` also adds the names, phone numbers, e-mail and web addresses in the task's own
    business text."""

    @field_validator("business_names")
    @classmethod
    def _business_names_valid(cls, v: list[str]) -> list[str]:
        return list(clean_names(v))

    @model_validator(mode="after")
    def _checks_are_rules(self) -> Task:
        for f in self.facts:
            if len(f.questions) <= self.held_out_per_fact:
                raise ValueError(f"fact {f.id!r}: needs more than held_out_per_fact={self.held_out_per_fact} questions")
            parse_rule_spec({"name": f.id, **f.answer_check})
        for i, item in enumerate(self.out_of_distribution):
            parse_rule_spec({"name": f"ood_{i}", **item.check})
        if self.agent is not None and (self.tool is None or self.tool.kind != "function"):
            raise ValueError("an agent task (`agent:`) needs a `tool` of kind `function`: the agent's tool")
        if self.agent is None and self.tool is not None and self.tool.kind == "function":
            raise ValueError("a `function` tool is called only by an agent: add `agent:`")
        return self

    # --- splits --------------------------------------------------------------------------------------
    def train_questions(self) -> list[tuple[Fact, str]]:
        return [(f, q) for f in self.facts for q in f.questions[: len(f.questions) - self.held_out_per_fact]]

    def held_out_questions(self) -> list[tuple[Fact, str]]:
        """Never sent during training rounds: the learning curve is measured on these."""
        return [(f, q) for f in self.facts for q in f.questions[len(f.questions) - self.held_out_per_fact:]]

    def messages(self, question: str, knowledge: list[str] | None = None) -> list[dict[str, str]]:
        system = self.system_prompt
        if knowledge:
            system = (system + "\n\nUse this knowledge:\n" + "\n".join(f"- {k}" for k in knowledge)).strip()
        msgs = [{"role": "system", "content": system}] if system else []
        return [*msgs, {"role": "user", "content": question}]

    def fact_by_id(self, fact_id: str) -> Fact:
        for f in self.facts:
            if f.id == fact_id:
                return f
        raise KeyError(fact_id)


def check_answer(fact: Fact, text: str) -> RuleResult:
    return grade_rule({"name": fact.id, **fact.answer_check}, text)


def check_ood(item: OODItem, index: int, text: str) -> RuleResult:
    return grade_rule({"name": f"ood_{index}", **item.check}, text)


def load_task(name_or_path: str | Path) -> Task:
    """A task by file path or by the name of a shipped task (`support_desk`)."""
    path = Path(name_or_path)
    if not path.exists():
        path = TASKS_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        shipped = ", ".join(p.stem for p in sorted(TASKS_DIR.glob("*.yaml")))
        raise TaskError(f"no task file {name_or_path!r} (shipped tasks: {shipped})")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
        if isinstance(data, dict) and "extends" in data:
            data = _extended(path, data)
        return Task.model_validate(data)
    except yaml.YAMLError as e:
        raise TaskError(yaml_errors.syntax_error(path, e)) from None
    except ValidationError as e:
        raise TaskError(yaml_errors.validation_error(path, text, e)) from None


def _extended(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """`extends: <task>`: a variant of another task file (a shipped name or a path beside this file),
    whose top-level keys replace the base's. One level only, so a variant reads as "the base, except".
    The base is resolved to a dict and validated together with the variant's keys."""
    base_name = data.pop("extends")
    if not isinstance(base_name, str):
        raise TaskError(f"{path}: `extends` must name a task file")
    base_path = path.parent / base_name if (path.parent / base_name).is_file() else TASKS_DIR / f"{base_name}.yaml"
    if not base_path.is_file():
        raise TaskError(f"{path}: extends {base_name!r}, which is no task file")
    base = yaml.safe_load(base_path.read_text(encoding="utf-8"))
    if not isinstance(base, dict) or "extends" in base:
        raise TaskError(f"{path}: the base {base_name!r} must be a task file that extends no other")
    return {**base, **data}


@functools.lru_cache(maxsize=8)
def _training_checks(task: str) -> dict[str, Fact]:
    t = load_task(task)
    return {q: f for f, q in t.train_questions()}


def verify_training_answer(messages: list[dict[str, str]], text: str, task: str) -> bool | None:
    """The task's answer check as a trainer verifier (`APPRENTICE_TRAINER_SFT_VERIFIER`): the product's KPI
    rule applied to a candidate answer for a deployment question. Only training questions are known to it
    (None for anything else), so a held-out question can never yield a training target."""
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    fact = _training_checks(task).get(question)
    return None if fact is None else check_answer(fact, text).value >= 1
