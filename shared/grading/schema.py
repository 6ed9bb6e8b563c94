"""Grader-config YAML --> validated pydantic models, shared by the grader and the weights eval gate.

One file configures every tenant and task:

```yaml
version: demo-1                      # stamped on every graded record (grader_config_version)
tasks:
  - tenant: demo                     # "*" = any tenant
    task: support                    # "*" = any task
    feedback_window_s: 120           # how long to wait for feedback before emitting
    graders:
      - {name: resolved, type: kpi, kpi: resolved, weight: 1.0, success: true}
      - {name: has_code, type: regex, pattern: "FORM-[0-9]+", weight: 0.2}
detectors: {length_corr_threshold: 0.6}   # reward-hacking detector thresholds (optional)
```

Grader entries are a discriminated union on `type`. Rule graders (`exact`, `contains`, `regex`,
`json_schema`, `verifier`) judge the response text alone and are pure; `feedback` and `kpi` read user
feedback events; `judge` asks an LLM through the Inference service. Every error names the place in the
file and what to change (`GraderConfigError`), because a bad config must stop the grader at start,
not silently emit wrong rewards.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_PATTERN = r"^[A-Za-z0-9_.\-]+$"


class GraderConfigError(ValueError):
    """The grader config is invalid. Fatal at start: the message says where and what to change."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _GraderBase(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    """Component name in the record (`RewardComponent.name`); unique within a task."""

    weight: float = Field(default=1.0, ge=0.0)
    """Weight in the final reward (a weighted mean over the components that have signal). 0 = recorded only."""

    success: bool = False
    """This component decides the record's `success` flag (task-level success, for learning curves)."""

    success_threshold: float = 0.5
    """`success` is true when this component's value is >= this threshold."""


class _RuleBase(_GraderBase):
    on_pass: float = 1.0
    """Value when the rule passes."""

    on_fail: float = 0.0
    """Value when the rule fails (0 rather than -1 so that pass rates read directly as means)."""


# --- rule graders (pure: text [+ reference] -> value) ----------------------------------------------

class ExactSpec(_RuleBase):
    type: Literal["exact"] = "exact"
    expected: str | None = None
    """The exact expected text; or use `reference_key`."""
    reference_key: str | None = None
    """Take the expected text from `reference[reference_key]` (eval sets, corrections)."""
    ignore_case: bool = False
    normalize_whitespace: bool = True
    """Strip and collapse runs of whitespace on both sides before comparing."""

    @model_validator(mode="after")
    def _one_source(self) -> ExactSpec:
        if (self.expected is None) == (self.reference_key is None):
            raise ValueError("exact grader needs exactly one of `expected` or `reference_key`")
        return self


class ContainsSpec(_RuleBase):
    type: Literal["contains"] = "contains"
    any_of: list[str] = Field(default_factory=list)
    """Pass when at least one of these strings occurs."""
    all_of: list[str] = Field(default_factory=list)
    """Pass when every one of these strings occurs (combined with `any_of` by AND)."""
    reference_key: str | None = None
    """Also require `reference[reference_key]`: a string must occur; a list means any one of them."""
    ignore_case: bool = False

    @model_validator(mode="after")
    def _something(self) -> ContainsSpec:
        if not (self.any_of or self.all_of or self.reference_key):
            raise ValueError("contains grader needs `any_of`, `all_of` or `reference_key`")
        if any(not s for s in [*self.any_of, *self.all_of]):
            raise ValueError("contains grader strings must not be empty (an empty string matches everything)")
        return self


class RegexSpec(_RuleBase):
    type: Literal["regex"] = "regex"
    pattern: str
    """Python `re` syntax."""
    match: Literal["search", "fullmatch"] = "search"
    """`search`: anywhere in the text; `fullmatch`: the whole (stripped) text."""
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"invalid regular expression {v!r}: {e}") from e
        return v


class JsonSchemaSpec(_RuleBase):
    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any] = Field(alias="schema")
    """A JSON Schema (any draft `jsonschema` knows; `$schema` picks it, default latest)."""
    lenient: bool = True
    """Accept JSON inside a ``` fence or surrounded by prose (the first {...} / [...] span)."""

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.validators.validator_for(v).check_schema(v)
        except jsonschema.SchemaError as e:
            raise ValueError(f"not a valid JSON Schema: {e.message}") from e
        return v


class VerifierSpec(_RuleBase):
    type: Literal["verifier"] = "verifier"
    function: str
    """Dotted path `package.module:function` (or `package.module.function`). Called as
    `fn(text, reference=reference, **params)`; returns a bool (pass/fail), a float (the value), None
    (no signal), a `RuleResult`, or `(value, detail)`. Must be pure and fast: it runs in the stream."""
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("function")
    @classmethod
    def _importable(cls, v: str) -> str:
        load_function(v)
        return v


# --- feedback-dependent graders -------------------------------------------------------------------

class FeedbackSpec(_GraderBase):
    type: Literal["feedback"] = "feedback"
    kind: Literal["thumbs", "rating", "correction"]
    """thumbs: value > 0 -> +1, < 0 -> -1; rating: scaled linearly to [-1, 1]; correction: a fixed value."""
    rating_min: float = 1.0
    rating_max: float = 5.0
    correction_value: float = -1.0
    """A correction means the answer needed fixing; the corrected text itself is kept in the record."""

    @model_validator(mode="after")
    def _range(self) -> FeedbackSpec:
        if self.rating_max <= self.rating_min:
            raise ValueError("rating_max must be greater than rating_min")
        return self


class KpiSpec(_GraderBase):
    type: Literal["kpi"] = "kpi"
    kpi: str = Field(min_length=1)
    """KPI event name (`FeedbackEvent.kpi_name`)."""
    map: dict[float, float] | None = None
    """Exact KPI value -> reward (e.g. {1: 1.0, 0: 0.0}); an unmapped value falls back to the linear scale."""
    value_range: tuple[float, float] = (0.0, 1.0)
    """Linear scale: KPI values in this range map onto `reward_range` (clamped)."""
    reward_range: tuple[float, float] = (0.0, 1.0)

    @model_validator(mode="after")
    def _range(self) -> KpiSpec:
        if self.value_range[1] == self.value_range[0]:
            raise ValueError("kpi value_range must not be empty")
        return self


class JudgeSpec(_GraderBase):
    type: Literal["judge"] = "judge"
    rubric: str = Field(min_length=1)
    """What a good response does; the judge scores each response 0..10 against it."""
    endpoint: str | None = None
    """Inference service host:port; None = the grader's configured endpoint."""
    max_new_tokens: int = Field(default=128, ge=8, le=4096)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    timeout_s: float = Field(default=60.0, gt=0)
    group_relative: bool = True
    """Score the responses of one group (same prompt, `group_id`) together, relative to each other (RULER)."""
    group_wait_s: float = Field(default=10.0, ge=0)
    """How long to wait for the rest of a group before judging what has arrived."""


RULE_TYPES = frozenset({"exact", "contains", "regex", "json_schema", "verifier"})
FEEDBACK_TYPES = frozenset({"feedback", "kpi"})

RuleSpec = Annotated[ExactSpec | ContainsSpec | RegexSpec | JsonSchemaSpec | VerifierSpec,
                     Field(discriminator="type")]
GraderSpec = Annotated[ExactSpec | ContainsSpec | RegexSpec | JsonSchemaSpec | VerifierSpec | FeedbackSpec
                       | KpiSpec | JudgeSpec, Field(discriminator="type")]


# --- detectors ------------------------------------------------------------------------------------

class DetectorConfig(_Strict):
    """Thresholds of the reward-hacking detectors (services/grader/core/detectors.py)."""

    window: int = Field(default=200, ge=10)
    """Records per (tenant, task, policy version) kept for the rolling statistics."""
    min_samples: int = Field(default=20, ge=3)
    """No statistical flag before this many records of a policy version (noise)."""
    length_corr_threshold: float = Field(default=0.6, gt=0, le=1)
    """Pearson correlation of reward and response length above which long responses are flagged."""
    length_shift_ratio: float = Field(default=1.5, gt=1)
    """Mean length of a version / mean of the previous version above which the shift is flagged."""
    truncation_rate_threshold: float = Field(default=0.3, gt=0, le=1)
    """Share of `finish_reason == "length"` above which truncated records may be flagged (when it rose
    and pays: see the next two)."""
    truncation_rate_rise: float = Field(default=0.2, gt=0, le=1)
    """Rise of a version's truncation rate over the previous version's above which the policy learned to
    run into the cap."""
    truncation_reward_gap: float = Field(default=0.1, ge=0)
    """Mean reward of a version's truncated records over its finished ones above which truncation pays."""
    repetition_threshold: float = Field(default=0.5, gt=0, le=1)
    """Share of repeated word 4-grams above which a response is degenerate."""
    repetition_min_words: int = Field(default=12, ge=4)
    judge_kpi_disagreement: float = Field(default=0.5, gt=0)
    """|judge - KPI| (both on 0..1) above which a record is flagged."""
    reward_jump: float = Field(default=0.35, gt=0)
    """Rise of a version's mean reward over the previous version's above which its records are flagged."""
    constant_reply_share: float = Field(default=0.3, gt=0, le=1)
    """Share of a version's distinct prompts (in the window) answered by one and the same reply at or above
    which that reply may be a collapse (`constant_reply`, when it also scores low: the next setting)."""
    constant_reply_max_reward: float = 0.5
    """Mean reward (the task's reward scale; 0..1 for KPI tasks) at or below which such a reply is flagged: a
    reply that is right for the prompts it answers scores high and is left alone."""
    tool_timeout_pattern: str = r"(?i)\b(timed? ?out|deadline exceeded|tool (error|failure|unavailable))\b"
    """A `tool` message matching this marks a tool time-out: the record is masked, not rewarded 0."""
    infra_kpis: list[str] = Field(default_factory=lambda: ["tool_timeout", "infra_error"])
    """KPI events (value > 0) that report an infrastructure failure: the record is masked."""
    quarantine_flags: list[str] = Field(default_factory=lambda: [
        "length_exploit", "length_shift", "high_truncation", "degenerate", "judge_kpi_disagreement",
        "reward_jump", "constant_reply"])
    """Flags that quarantine a record (the trainer takes no gradient on it)."""


# --- the file -------------------------------------------------------------------------------------

class TaskGraders(_Strict):
    tenant: str = "*"
    task: str = "*"
    feedback_window_s: float = Field(default=300.0, gt=0, le=7 * 24 * 3600)
    """Wait this long (from the interaction's occurred_at) for feedback; minutes by default, hours allowed."""
    feedback_mode: Literal["required", "optional"] | None = None
    """required: window expiry without feedback emits *no signal*; optional: the immediate graders' reward.
    Default: required when the task has a feedback/kpi grader."""
    emit_when: Literal["all_feedback", "any_feedback", "window_end"] = "all_feedback"
    """Emit before the window ends once every (or any) feedback grader has signal; later feedback revises."""
    graders: list[GraderSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> TaskGraders:
        names = [g.name for g in self.graders]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"grader names must be unique within a task; repeated: {', '.join(dupes)}")
        if self.feedback_mode == "required" and not self.feedback_graders:
            raise ValueError("feedback_mode 'required' needs a feedback or kpi grader with weight > 0")
        return self

    @property
    def feedback_graders(self) -> list[FeedbackSpec | KpiSpec]:
        """Graders that read feedback events and count in the reward (weight > 0). Weight-0 feedback
        graders are recorded but never make the grader wait."""
        return [g for g in self.graders if g.type in FEEDBACK_TYPES and g.weight > 0]  # type: ignore[misc]

    @property
    def needs_feedback(self) -> bool:
        """Window expiry without feedback = no signal (rather than the immediate graders' reward)."""
        mode = self.feedback_mode or ("required" if self.feedback_graders else "optional")
        return mode == "required"

    @property
    def waits_for_feedback(self) -> bool:
        """Hold the first emission until feedback (or window end) instead of emitting at once."""
        return bool(self.feedback_graders)

    @property
    def judges(self) -> list[JudgeSpec]:
        return [g for g in self.graders if isinstance(g, JudgeSpec)]


class GraderConfig(_Strict):
    version: str = Field(min_length=1)
    """Stamped on every graded record (`grader_config_version`); change it when rewards change meaning."""
    tasks: list[TaskGraders] = Field(min_length=1)
    detectors: DetectorConfig = Field(default_factory=DetectorConfig)

    @model_validator(mode="after")
    def _unique_tasks(self) -> GraderConfig:
        seen: set[tuple[str, str]] = set()
        for t in self.tasks:
            if (t.tenant, t.task) in seen:
                raise ValueError(f"tenant {t.tenant!r} task {t.task!r} is configured twice")
            seen.add((t.tenant, t.task))
        return self

    def for_task(self, tenant: str, task: str) -> TaskGraders | None:
        """Most specific entry: (tenant, task) > (tenant, *) > (*, task) > (*, *); None if nothing matches."""
        by_key = {(t.tenant, t.task): t for t in self.tasks}
        for key in ((tenant, task), (tenant, "*"), ("*", task), ("*", "*")):
            if key in by_key:
                return by_key[key]
        return None


def load_function(path: str) -> Callable[..., Any]:
    """`pkg.mod:fn` or `pkg.mod.fn` --> the callable; ValueError with the reason otherwise."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"verifier {path!r} is not a dotted path like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"verifier {path!r}: cannot import module {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"verifier {path!r}: module {module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid grader config {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_grader_config(data: Any, *, source: str = "<config>") -> GraderConfig:
    """A parsed YAML/JSON document --> GraderConfig, or GraderConfigError listing every problem."""
    if not isinstance(data, dict):
        raise GraderConfigError(f"invalid grader config {source}: the top level must be a mapping with "
                                f"`version` and `tasks`, got {type(data).__name__}")
    try:
        return GraderConfig.model_validate(data)
    except ValidationError as e:
        raise GraderConfigError(_format_errors(e, source)) from None


def load_grader_config(path: str | Path) -> GraderConfig:
    """Read and validate a grader-config YAML file (see the module docstring for the shape)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise GraderConfigError(f"cannot read grader config {p}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise GraderConfigError(f"grader config {p} is not valid YAML: {e}") from None
    return parse_grader_config(data, source=str(p))
