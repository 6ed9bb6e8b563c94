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
personal data (inference at capture and feedback, the extractor's knowledge filter),
`APPRENTICE_BUSINESS_NAMES` with the task tenant's business names: the task file's `business_names:` plus the
names the detector itself finds (PERSON spans) in the task's own business text, its system prompt, facts and
corrections. A task file is configuration the business wrote, so the names in it are the business's words
(its staff, its products); without them the simulated backend's corrections would reach the topics as
"<PERSON> approves returns" and never be learned. The questions are not read: they are what end users ask.
Names already in `APPRENTICE_BUSINESS_NAMES` (other tenants, or this one) are kept. Otherwise the extractor
needs nothing: it keys knowledge by each interaction's own tenant/task.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from services.grader.settings import DEFAULT_CONFIG
from services.weights.evalset import EvalSetError, OodSet, load_heldout, load_ood
from shared.grading import DetectorConfig, GraderConfigError, parse_grader_config
from shared.privacy import get_detector
from shared.privacy.business import clean_name, clean_names, parse_business_names
from shared.privacy.detector import PERSON
from tools.tasks.task import OODItem, Task, TaskError

BUSINESS_NAMES_ENV = "APPRENTICE_BUSINESS_NAMES"
REDACTING_SERVICES = ("inference", "extractor")
"""The services that redact personal data, and so need the tenant's business names."""

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


def derived_business_names(task: Task) -> list[str]:
    """The names the shared detector finds (PERSON spans) in `business_text(task)`, in order, each once.
    Spans that could not be a declared name (too short, pattern characters) are left out: they stay redacted."""

    detector = get_detector()   # the one the services redact with, so it finds what they would redact
    found: dict[str, str] = {}
    for text in business_text(task):
        for span in detector.find(text):
            if span.entity != PERSON:
                continue
            try:
                name = clean_name(text[span.start:span.end].strip(".,;:!?'\u2019\"()"))
            except ValueError:
                continue
            found.setdefault(name.casefold(), name)
    return list(found.values())


def business_names(task: Task) -> list[str]:
    """The task's declared `business_names` followed by the derived ones (duplicates, ignoring case, once)."""
    try:
        return list(clean_names([*task.business_names, *derived_business_names(task)]))
    except ValueError as e:
        raise TaskError(f"task {task.name!r}: business names: {e}") from None


def business_names_env(task: Task, environ: Mapping[str, str] | None = None) -> str:
    """`APPRENTICE_BUSINESS_NAMES` for the task's stack: the mapping already in `environ` (default: this
    process's environment; other tenants' names and this tenant's own stay) with the task's names added to
    its tenant's list."""
    env = os.environ if environ is None else environ
    raw = env.get(BUSINESS_NAMES_ENV, "").strip()
    try:
        current = {t: list(n) for t, n in parse_business_names(json.loads(raw) if raw else {}).items()}
        current[task.tenant] = list(clean_names([*current.get(task.tenant, []), *business_names(task)]))
    except (json.JSONDecodeError, ValueError) as e:
        raise TaskError(f"{BUSINESS_NAMES_ENV} with task {task.name!r}'s names: {e}") from None
    return json.dumps(current, ensure_ascii=False, sort_keys=True)


def write_task_config(task: Task, directory: Path, environ: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Write the task's config files into `directory` and return the per-service environment that uses
    them. Every file is validated here with the services' own loaders, so a task the services would
    refuse fails before anything starts. `environ` (default: this process's environment) supplies business
    names declared outside the task, which the returned `APPRENTICE_BUSINESS_NAMES` keeps."""

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
    # every service that redacts keeps the business's own words (shared/privacy/business.py)
    names = business_names_env(task, environ)
    for service in REDACTING_SERVICES:
        per_service[service][BUSINESS_NAMES_ENV] = names
    return per_service
