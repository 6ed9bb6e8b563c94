"""Eval-set YAML --> validated prompts with rule graders (held-out) or reference answers (OOD).

Held-out set (the task the loop trains on; graded by the same rule graders as the training reward):

```yaml
name: support-heldout
system: "You are the support assistant of ..."      # optional, prepended to every prompt
grader_config: path/to/graders.yaml                 # optional: take the task's rule graders from there
tenant: "*"                                          # with grader_config: which entry
task: support
graders:                                             # rule graders for items that name none
  - {name: fact, type: contains, reference_key: answer, ignore_case: true}
items:
  - prompt: "Which form do I need to return a jacket?"     # or messages: [{role, content}, ...]
    reference: {answer: "RT-7"}
```

OOD set (general instructions): `answer` items are scored by the likelihood of the reference answer,
`check` items by a rule grader on the greedy answer (which also counts for the repetition rate):

```yaml
name: general
items:
  - prompt: "Give me two tips for a good night's sleep."
    answer: "Keep a regular bedtime, and avoid screens for an hour before sleeping."
  - prompt: "What is the capital of France?"
    check: {type: contains, any_of: ["Paris"], ignore_case: true}
```

Both kinds may instead (or also) name a loop task file (`task_file: path`, tools/demo/README.md
format; relative to the eval set's folder): the held-out set then takes the task's held-out questions
(the last `held_out_per_fact` of each fact, never trained on) with each fact's `answer_check`, and the
OOD set takes the task's `out_of_distribution` questions with their checks. The packaged defaults do
this for the demo task (tools/tasks/support_desk.yaml).
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.grading import GraderConfigError, RuleSpec, load_grader_config, parse_rule_spec
from shared.grading.schema import RULE_TYPES


class EvalSetError(ValueError):
    """The eval set is invalid; fatal at start. The message says where and what to change."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Strict):
    role: str = Field(pattern=r"^(system|user|assistant)$")
    content: str


class _Item(_Strict):
    prompt: str | None = None
    messages: list[Message] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> _Item:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("each item needs exactly one of `prompt` or `messages`")
        return self

    def chat(self, system: str | None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": system}] if system else []
        if self.messages is not None:
            return msgs + [m.model_dump() for m in self.messages]
        return msgs + [{"role": "user", "content": self.prompt or ""}]


class HeldoutItem(_Item):
    reference: dict[str, Any] = Field(default_factory=dict)
    graders: list[dict[str, Any]] | None = None


class HeldoutSet(_Strict):
    name: str = "heldout"
    system: str | None = None
    grader_config: str | None = None
    tenant: str = "*"
    task: str = "*"
    task_file: str | None = None
    graders: list[dict[str, Any]] = Field(default_factory=list)
    items: list[HeldoutItem] = Field(default_factory=list)


class OodItem(_Item):
    answer: str | None = Field(default=None, min_length=1)
    check: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _scored(self) -> OodItem:
        if self.answer is None and self.check is None:
            raise ValueError("each OOD item needs a reference `answer`, a rule `check`, or both")
        return self


class OodSet(_Strict):
    name: str = "ood"
    system: str | None = None
    task_file: str | None = None
    items: list[OodItem] = Field(default_factory=list)


class LoadedHeldout:
    """A held-out set with each item's rule graders resolved and validated."""

    def __init__(self, spec: HeldoutSet, graders: list[list[RuleSpec]], digest: str) -> None:
        self.spec = spec
        self.graders = graders
        self.digest = digest


def _packaged_dir() -> Path:
    return Path(str(resources.files("services.weights.evalsets")))


def _read(path: Path | None, default: str) -> tuple[Any, str, str]:
    if path is None:
        text = (_packaged_dir() / default).read_text(encoding="utf-8")
        source = f"<packaged {default}>"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise EvalSetError(f"cannot read eval set {path}: {e.strerror}") from None
        source = str(path)
    try:
        return yaml.safe_load(text), source, hashlib.sha256(text.encode()).hexdigest()[:16]
    except yaml.YAMLError as e:
        raise EvalSetError(f"eval set {source} is not valid YAML: {e}") from None


def _errors(e: ValidationError, source: str) -> str:
    lines = [f"invalid eval set {source}:"]
    lines += [f"  {'.'.join(map(str, x['loc'])) or '(top)'}: {x['msg'].removeprefix('Value error, ')}"
              for x in e.errors()]
    return "\n".join(lines)


def _task(task_file: str, path: Path | None, source: str) -> dict[str, Any]:
    """A loop task file (plain YAML: facts with questions and answer_check, out_of_distribution)."""
    p = Path(task_file)
    if not p.is_absolute():
        p = (Path(path).parent if path is not None else _packaged_dir()) / p
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise EvalSetError(f"eval set {source}: cannot read task file {p}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("facts", []), list):
        raise EvalSetError(f"eval set {source}: {p} is not a task file (a mapping with `facts`)")
    return data


def _heldout_from_task(spec: HeldoutSet, task: dict[str, Any], source: str) -> HeldoutSet:
    keep = int(task.get("held_out_per_fact", 2))
    items = list(spec.items)
    try:
        for f in task.get("facts", []):
            for q in f["questions"][-keep:]:
                items.append(HeldoutItem(prompt=q, graders=[{"name": f["id"], **f["answer_check"]}]))
    except (KeyError, TypeError, ValidationError) as e:
        raise EvalSetError(f"eval set {source}: task file fact without id/questions/answer_check: {e}") from None
    return spec.model_copy(update={"items": items, "system": spec.system or task.get("system_prompt") or None})


def load_heldout(path: Path | None = None) -> LoadedHeldout:
    data, source, digest = _read(path, "heldout.yaml")
    try:
        spec = HeldoutSet.model_validate(data)
    except ValidationError as e:
        raise EvalSetError(_errors(e, source)) from None
    if spec.task_file:
        spec = _heldout_from_task(spec, _task(spec.task_file, path, source), source)
    if not spec.items:
        raise EvalSetError(f"eval set {source}: no items (give `items` or a `task_file`)")
    defaults: list[Any] = list(spec.graders)
    if spec.grader_config:
        cfg_path = Path(spec.grader_config)
        if path is not None and not cfg_path.is_absolute():
            cfg_path = Path(path).parent / cfg_path
        try:
            task = load_grader_config(cfg_path).for_task(spec.tenant, spec.task)
        except GraderConfigError as e:
            raise EvalSetError(f"eval set {source}: {e}") from None
        if task is None:
            raise EvalSetError(f"eval set {source}: {cfg_path} has no graders for tenant {spec.tenant!r} "
                               f"task {spec.task!r}")
        defaults += [g for g in task.graders if g.type in RULE_TYPES]
    resolved: list[list[RuleSpec]] = []
    for i, item in enumerate(spec.items):
        entries = item.graders if item.graders is not None else defaults
        if not entries:
            raise EvalSetError(f"eval set {source}: item {i} has no rule graders (give `graders` on the item or "
                               "at the top, or a `grader_config` with rule graders for the task)")
        try:
            resolved.append([parse_rule_spec(g) for g in entries])
        except GraderConfigError as e:
            raise EvalSetError(f"eval set {source}: item {i}: {e}") from None
    return LoadedHeldout(spec, resolved, digest)


def load_ood(path: Path | None = None) -> tuple[OodSet, str]:
    data, source, digest = _read(path, "ood.yaml")
    try:
        spec = OodSet.model_validate(data)
        if spec.task_file:
            task = _task(spec.task_file, path, source)
            extra = [OodItem(prompt=x["question"], check=x["check"]) for x in task.get("out_of_distribution", [])]
            spec = spec.model_copy(update={"items": [*spec.items, *extra]})
        for i, item in enumerate(spec.items):
            if item.check is not None:
                parse_rule_spec({"name": f"ood_{i}", **item.check})
    except ValidationError as e:
        raise EvalSetError(_errors(e, source)) from None
    except (KeyError, TypeError) as e:
        raise EvalSetError(f"eval set {source}: task file OOD item without question/check: {e}") from None
    except GraderConfigError as e:
        raise EvalSetError(f"eval set {source}: {e}") from None
    if not spec.items:
        raise EvalSetError(f"eval set {source}: no items (give `items` or a `task_file`)")
    return spec, digest
