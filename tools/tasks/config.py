"""Task file --> the per-task settings of every service the demo (or `apprentice up --task`) starts.

A task file names its tenant, task tag and KPI. The services know nothing of task files: the grader
routes by (tenant, task) in its grader config, the weights gate scores candidates on eval-set files, the
trainer trains one tenant and filters teacher samples with a verifier. Left at their defaults, those
describe the shipped support desk only, so another organisation's KPI would wait out the catch-all
window unrewarded and the gate would score the wrong questions. This module writes, from the task:

- `task.yaml`: the validated task, the one copy every service reads (an edit to the source file during a
  run cannot make the services disagree);
- `grader.yaml`: the default grader config with the task's own entry first (its KPI rewarded, the
  correction and thumbs recorded at weight 0, its feedback window);
- `heldout.yaml`, `ood.yaml`: the gate's held-out questions (the task's, never trained on) and the
  general OOD set plus the task's own OOD questions (none is fine: the general items remain);

and returns the environment that points each service at them, including, for every service that redacts
personal data (inference at capture and feedback, the extractor's knowledge filter), the task tenant's public
business data: `APPRENTICE_BUSINESS_NAMES` with its names (the task file's `business_names:` and
`business_data.names`, plus the names the detector itself finds, PERSON spans, in the task's own business text:
its system prompt, facts and corrections) and `APPRENTICE_BUSINESS_DATA` with its phone numbers, e-mail, street
and web addresses (the file's `business_data:`, plus the phone numbers and e-mail addresses the detector finds
in that text and the web addresses written in it). A task file is configuration the business wrote, so the
names and numbers in it are the business's (its staff, its products, its support line); without them the
simulated backend's corrections would reach the topics as "<PERSON> approves returns" or "call <PHONE_NUMBER>"
and never be learned. The questions are not read: they are what end users ask. What the environment already
declares in both variables (other tenants, or this one) is kept. Otherwise the extractor needs nothing: it
keys knowledge by each interaction's own tenant/task.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from services.grader.settings import DEFAULT_CONFIG
from services.weights.evalset import EvalSetError, OodSet, load_heldout, load_ood
from shared.grading import DetectorConfig, GraderConfigError, parse_grader_config
from shared.privacy import get_detector
from shared.privacy.business import (
    EMAILS,
    KINDS,
    NAMES,
    PHONES,
    URLS,
    clean_email,
    clean_name,
    clean_names,
    clean_phone,
    clean_url,
    clean_values,
    normalised,
    parse_business_data,
    parse_business_names,
)
from shared.privacy.detector import EMAIL, PERSON, PHONE
from tools.tasks.task import OODItem, Task, TaskError

BUSINESS_NAMES_ENV = "APPRENTICE_BUSINESS_NAMES"
BUSINESS_DATA_ENV = "APPRENTICE_BUSINESS_DATA"
MERGED_ENVS = (BUSINESS_NAMES_ENV, BUSINESS_DATA_ENV)
"""Variables whose value `write_task_config` returns already merged with the environment's own (the caller
sets them rather than letting a value the user set win)."""
REDACTING_SERVICES = ("inference", "extractor")
"""The services that redact personal data, and so need the tenant's business data."""

WEB_ADDRESS = re.compile(r"(?<![\w.@/\-])(?:https?://|www\.)[^\s<>\"'()]*[^\s<>\"'().,;:!?]", re.IGNORECASE)
"""A web address written in text with its scheme or "www." (the detector has no URL type: a host alone is
not told apart from a file name or a sentence's last word without a list of top-level names)."""

_DERIVED = {PERSON: (NAMES, clean_name), PHONE: (PHONES, clean_phone), EMAIL: (EMAILS, clean_email)}

_RESERVED_GRADER_NAMES = ("corrected", "thumbs")


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=120)


def task_entry(task: Task) -> dict[str, Any]:
    """The task's grader-config entry: the KPI decides reward and success; the correction text stays in
    the record (the extractor's source) and thumbs are recorded, both at weight 0."""
    kpi = task.kpi.name
    name = f"kpi_{kpi}" if kpi in _RESERVED_GRADER_NAMES else kpi
    return {"tenant": task.tenant, "task": task.task, "feedback_window_s": task.kpi.feedback_window_s,
            "graders": [
                {"name": name, "type": "kpi", "kpi": kpi, "map": {1: 1.0, 0: 0.0}, "weight": 1.0, "success": True},
                {"name": "corrected", "type": "feedback", "kind": "correction", "correction_value": 0.0,
                 "weight": 0.0},
                {"name": "thumbs", "type": "feedback", "kind": "thumbs", "weight": 0.0},
            ]}


def grader_config(task: Task, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`base` (the grader's packaged default config) with the task's entry in front of every other entry
    it keeps (the catch-all, other tenants' tasks); the version names the task and the entry's digest,
    so graded records say which rewards they were computed with."""
    if base is None:
        base = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    entry = task_entry(task)
    others = [t for t in base.get("tasks", []) if (t.get("tenant", "*"), t.get("task", "*")) != (task.tenant, task.task)]
    detectors = dict(base.get("detectors") or {})
    if task.tool is not None:
        # the backend's time-out telemetry must reach the time-out detector (masked: no reward either way)
        infra = list(detectors.get("infra_kpis", DetectorConfig().infra_kpis))
        if task.tool.timeout_kpi not in infra:
            detectors["infra_kpis"] = [*infra, task.tool.timeout_kpi]
    digest = hashlib.sha256(json.dumps([entry, detectors], sort_keys=True).encode()).hexdigest()[:8]
    return {**base, "version": f"task-{task.name}-{digest}", "tasks": [entry, *others], "detectors": detectors}


def ood_set(task: Task, task_file: Path, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The packaged general OOD items (reference answers and general questions with checks) plus the
    task's `out_of_distribution` questions (read from the task file by the gate)."""
    if base is None:
        base = packaged_ood()
    return {"name": f"general+{task.name}", "task_file": str(task_file), "items": list(base.get("items", []))}


def packaged_ood() -> dict[str, Any]:
    """The general OOD set shipped with the weights service (`services/weights/evalsets/ood.yaml`)."""
    data: dict[str, Any] = yaml.safe_load(
        (resources.files("services.weights.evalsets") / "ood.yaml").read_text(encoding="utf-8"))
    return data


def general_ood_questions() -> list[OODItem]:
    """The packaged general questions with a rule check, as task OOD items. The demo asks them beside the
    task's own `out_of_distribution` list so that its "OOD must not regress" reading and the gate's rule
    check look at the same forty-odd questions, not at six."""

    spec = OodSet.model_validate(packaged_ood())   # the gate's own schema, so both read the file alike
    return [OODItem(question=it.prompt, check=it.check) for it in spec.items
            if it.check is not None and it.prompt is not None]


def business_text(task: Task) -> list[str]:
    """The text the business itself wrote in the task: its system prompt, its facts and its corrections (not
    the questions, which stand for end users' messages, nor the OOD set)."""
    return [t for t in (task.system_prompt, *(x for f in task.facts for x in (f.fact, f.correction))) if t]


def derived_business_data(task: Task) -> dict[str, list[str]]:
    """{kind: values} found in `business_text(task)`, in order, each once: the names (PERSON spans), phone
    numbers and e-mail addresses the shared detector finds, and the web addresses written out with a scheme or
    "www.". A value that could not be declared (a span too short, pattern characters) is left out: it stays
    redacted. Street addresses are not derived (the detector has no address type): declare them."""

    detector = get_detector()   # the one the services redact with, so it finds what they would redact
    found: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
    for text in business_text(task):
        for span in detector.find(text):
            if span.entity not in _DERIVED:
                continue
            kind, clean = _DERIVED[span.entity]
            try:
                value = clean(text[span.start:span.end].strip(".,;:!?'\u2019\"()" if kind == NAMES else ".,;:!?'\u2019\""))
            except ValueError:
                continue
            found[kind].setdefault(normalised(kind, value), value)
        for m in WEB_ADDRESS.finditer(text):
            try:
                url = clean_url(m.group(0))
            except ValueError:
                continue
            found[URLS].setdefault(normalised(URLS, url), url)
    return {kind: list(values.values()) for kind, values in found.items() if values}


def derived_business_names(task: Task) -> list[str]:
    """The names the shared detector finds (PERSON spans) in `business_text(task)`, in order, each once."""
    return derived_business_data(task).get(NAMES, [])


def business_names(task: Task, derived: dict[str, list[str]] | None = None) -> list[str]:
    """The task's declared `business_names` and `business_data.names`, followed by the derived ones
    (duplicates, ignoring case, once)."""
    derived = derived_business_data(task) if derived is None else derived
    try:
        return list(clean_names([*task.business_names, *task.business_data.names, *derived.get(NAMES, [])]))
    except ValueError as e:
        raise TaskError(f"task {task.name!r}: business names: {e}") from None


def business_data(task: Task, derived: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """The task's declared `business_data` of every kind but names (those are `business_names`), followed by
    the derived values (duplicates, as redaction compares them, once); kinds with none left out."""
    derived = derived_business_data(task) if derived is None else derived
    declared = task.business_data.declaration()
    out: dict[str, list[str]] = {}
    for kind in KINDS:
        if kind == NAMES:
            continue
        try:
            if values := list(clean_values(kind, [*declared[kind], *derived.get(kind, [])])):
                out[kind] = values
        except ValueError as e:
            raise TaskError(f"task {task.name!r}: business data: {e}") from None
    return out


def business_names_env(task: Task, environ: Mapping[str, str] | None = None,
                       derived: dict[str, list[str]] | None = None) -> str:
    """`APPRENTICE_BUSINESS_NAMES` for the task's stack: the mapping already in `environ` (default: this
    process's environment; other tenants' names and this tenant's own stay) with the task's names added to
    its tenant's list."""
    env = os.environ if environ is None else environ
    raw = env.get(BUSINESS_NAMES_ENV, "").strip()
    try:
        current = {t: list(n) for t, n in parse_business_names(json.loads(raw) if raw else {}).items()}
        current[task.tenant] = list(clean_names([*current.get(task.tenant, []), *business_names(task, derived)]))
    except (json.JSONDecodeError, ValueError) as e:
        raise TaskError(f"{BUSINESS_NAMES_ENV} with task {task.name!r}'s names: {e}") from None
    return json.dumps(current, ensure_ascii=False, sort_keys=True)


def business_data_env(task: Task, environ: Mapping[str, str] | None = None,
                      derived: dict[str, list[str]] | None = None) -> str:
    """`APPRENTICE_BUSINESS_DATA` for the task's stack: the mapping already in `environ` (default: this
    process's environment; other tenants' data and this tenant's own stay) with the task's phone numbers,
    e-mail, street and web addresses (`business_data`) added to its tenant's."""
    env = os.environ if environ is None else environ
    raw = env.get(BUSINESS_DATA_ENV, "").strip()
    try:
        current = {t: {k: list(v) for k, v in d.items()}
                   for t, d in parse_business_data(json.loads(raw) if raw else {}).items()}
        mine = current.setdefault(task.tenant, {})
        for kind, values in business_data(task, derived).items():
            mine[kind] = list(clean_values(kind, [*mine.get(kind, []), *values]))
        if not mine:
            del current[task.tenant]
    except (json.JSONDecodeError, ValueError) as e:
        raise TaskError(f"{BUSINESS_DATA_ENV} with task {task.name!r}'s business data: {e}") from None
    return json.dumps(current, ensure_ascii=False, sort_keys=True)


def write_task_config(task: Task, directory: Path, environ: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Write the task's config files into `directory` and return the per-service environment that uses
    them. Every file is validated here with the services' own loaders, so a task the services would
    refuse fails before anything starts. `environ` (default: this process's environment) supplies business
    data declared outside the task, which the returned `APPRENTICE_BUSINESS_NAMES` and
    `APPRENTICE_BUSINESS_DATA` keep."""

    directory.mkdir(parents=True, exist_ok=True)
    task_file = (directory / "task.yaml").resolve()
    files = {
        "task.yaml": "# Written by the demo from the task file; the services read this copy.\n"
                     + _yaml(task.model_dump(mode="json")),
        "grader.yaml": _yaml(grader_config(task)),
        "heldout.yaml": _yaml({"name": f"{task.name}-heldout", "task_file": str(task_file)}),
        "ood.yaml": _yaml(ood_set(task, task_file)),
        # the held-out questions, for the trainer to leave out of its drills (a paraphrase it writes, or a
        # user's question, may match one): the evaluation stays on questions the weights never trained on
        "heldout-questions.txt": "".join(q.replace("\n", " ").strip() + "\n" for _, q in task.held_out_questions()),
    }
    for name, text in files.items():
        tmp = directory / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(directory / name)
    try:
        parse_grader_config(yaml.safe_load(files["grader.yaml"]), source=str(directory / "grader.yaml"))
        load_heldout(directory / "heldout.yaml")
        load_ood(directory / "ood.yaml")
    except (GraderConfigError, EvalSetError) as e:
        raise TaskError(f"task {task.name!r} gives an invalid service config: {e}") from None
    per_service: dict[str, dict[str, str]] = {
        "grader": {"APPRENTICE_GRADER_CONFIG_PATH": str(directory / "grader.yaml")},
        "weights": {"APPRENTICE_WEIGHTS_EVAL_SET": str(directory / "heldout.yaml"),
                    "APPRENTICE_WEIGHTS_OOD_SET": str(directory / "ood.yaml")},
        # no oracle: teacher samples are kept by what the loop itself knows (the item's answer terms), not by
        # the task file's answer check, which no product backend could run on a hypothetical answer
        "trainer": {"APPRENTICE_TRAINER_TENANT": task.tenant,
                    "APPRENTICE_TRAINER_DISTILL_EXCLUDE_QUESTIONS": str(directory / "heldout-questions.txt")},
        "extractor": {},
        "inference": {},
    }
    # every service that redacts keeps the business's own words and numbers (shared/privacy/business.py)
    derived = derived_business_data(task)
    names, data = business_names_env(task, environ, derived), business_data_env(task, environ, derived)
    for service in REDACTING_SERVICES:
        per_service[service][BUSINESS_NAMES_ENV] = names
        per_service[service][BUSINESS_DATA_ENV] = data
    return per_service
