"""Response text [+ reference] --> RuleResult: the pure rule graders (no network, no model).

Used by the grader service in the stream and by the weights service's eval gate on held-out sets, so a
candidate version is judged by exactly the rules that produce its training reward.

`grade_rule(spec, text, reference=...)` takes one grader-config entry (a dict as in the YAML, or an
already validated spec model). `has_signal=False` means the rule could not judge (a missing reference,
a verifier that returned None or raised): callers mask it, they do not count it as 0.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema
from pydantic import TypeAdapter, ValidationError

from shared.grading.schema import (
    ContainsSpec,
    ExactSpec,
    GraderConfigError,
    JsonSchemaSpec,
    RegexSpec,
    RuleSpec,
    VerifierSpec,
    load_function,
)

_RULE_ADAPTER: TypeAdapter[Any] = TypeAdapter(RuleSpec)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class RuleResult:
    value: float
    """The grader's value (on_pass / on_fail for rules; anything a verifier returns)."""
    has_signal: bool
    """False: the rule could not judge; mask it (it is not a 0)."""
    detail: str = ""
    """Why, for people reading the record."""


def parse_rule_spec(spec: dict[str, Any] | RuleSpec) -> RuleSpec:
    """A grader-config entry --> its validated rule model; GraderConfigError for a non-rule or a bad entry."""
    if not isinstance(spec, dict):
        if isinstance(spec, ExactSpec | ContainsSpec | RegexSpec | JsonSchemaSpec | VerifierSpec):
            return spec
        raise GraderConfigError(f"{type(spec).__name__} is not a rule grader (exact, contains, regex, "
                                "json_schema, verifier)")
    try:
        return _RULE_ADAPTER.validate_python(spec)  # type: ignore[no-any-return]
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'spec'}: {x['msg'].removeprefix('Value error, ')}"
                             for x in e.errors())
        raise GraderConfigError(f"invalid rule grader {spec.get('name', '?')!r}: {problems}") from None


def grade_rule(spec: dict[str, Any] | RuleSpec, text: str, *,
               reference: dict[str, Any] | None = None) -> RuleResult:
    """Apply one rule grader to `text`. Raises GraderConfigError only for an invalid spec."""
    s = parse_rule_spec(spec)
    if isinstance(s, ExactSpec):
        return grade_exact(s, text, reference)
    if isinstance(s, ContainsSpec):
        return grade_contains(s, text, reference)
    if isinstance(s, RegexSpec):
        return grade_regex(s, text)
    if isinstance(s, JsonSchemaSpec):
        return grade_json_schema(s, text)
    return grade_verifier(s, text, reference)


def _verdict(spec: Any, passed: bool, detail: str) -> RuleResult:
    return RuleResult(spec.on_pass if passed else spec.on_fail, True, detail)


def _reference_value(reference: dict[str, Any] | None, key: str) -> Any:
    if reference is None or reference.get(key) in (None, "", []):
        return None
    return reference[key]


def grade_exact(spec: ExactSpec, text: str, reference: dict[str, Any] | None = None) -> RuleResult:
    expected = spec.expected
    if spec.reference_key is not None:
        expected = _reference_value(reference, spec.reference_key)
        if expected is None:
            return RuleResult(0.0, False, f"no reference {spec.reference_key!r}")
        expected = str(expected)
    assert expected is not None, "validated: expected or reference_key"
    a = _normalized(text, spec.normalize_whitespace, spec.ignore_case)
    b = _normalized_expected(expected, spec.normalize_whitespace, spec.ignore_case)
    return _verdict(spec, a == b, "exact match" if a == b else "differs from the expected text")


def _normalized(s: str, whitespace: bool, case: bool) -> str:
    """Runs of whitespace -> one space, ends stripped (`" ".join(s.split())`: the same characters as
    a regex sub of whitespace runs, then strip(), five times faster); then casefolded when `case`."""
    if whitespace:
        s = " ".join(s.split())
    return s.casefold() if case else s


@lru_cache(maxsize=1024)
def _normalized_expected(expected: str, whitespace: bool, case: bool) -> str:
    """The expected side, normalized once per distinct text (a config's `expected` never changes)."""
    return _normalized(expected, whitespace, case)


def grade_contains(spec: ContainsSpec, text: str, reference: dict[str, Any] | None = None) -> RuleResult:
    def norm(s: str) -> str:
        return s.casefold() if spec.ignore_case else s

    hay = norm(text)
    any_of = list(spec.any_of)
    all_of = list(spec.all_of)
    if spec.reference_key is not None:
        ref = _reference_value(reference, spec.reference_key)
        if ref is None:
            return RuleResult(0.0, False, f"no reference {spec.reference_key!r}")
        if isinstance(ref, list | tuple):
            if not any(norm(str(r)) in hay for r in ref):
                return _verdict(spec, False, f"none of the reference strings {list(map(str, ref))!r} found")
        else:
            all_of.append(str(ref))
    missing = [s for s in all_of if norm(s) not in hay]
    if missing:
        return _verdict(spec, False, f"missing {missing!r}")
    if any_of and not any(norm(s) in hay for s in any_of):
        return _verdict(spec, False, f"none of {any_of!r} found")
    return _verdict(spec, True, "all required strings found")


@lru_cache(maxsize=256)
def _compiled(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE if ignore_case else 0)


def grade_regex(spec: RegexSpec, text: str) -> RuleResult:
    rx = _compiled(spec.pattern, spec.ignore_case)
    m = rx.fullmatch(text.strip()) if spec.match == "fullmatch" else rx.search(text)
    return _verdict(spec, m is not None, f"matched {m.group(0)[:80]!r}" if m else f"no {spec.match} match")


def extract_json(text: str, lenient: bool) -> Any:
    """The JSON value in `text`; lenient: also inside a ``` fence or the first {...}/[...] span."""
    try:
        return json.loads(text)
    except ValueError:
        if not lenient:
            raise
    candidates = [m.group(1) for m in _FENCE.finditer(text)]
    for open_c, close_c in (("{", "}"), ("[", "]")):
        start, end = text.find(open_c), text.rfind(close_c)
        if 0 <= start < end:
            candidates.append(text[start:end + 1])
    for c in candidates:
        try:
            return json.loads(c)
        except ValueError:
            continue
    raise ValueError("no JSON value found")


@lru_cache(maxsize=128)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def grade_json_schema(spec: JsonSchemaSpec, text: str) -> RuleResult:
    try:
        value = extract_json(text, spec.lenient)
    except ValueError as e:
        return _verdict(spec, False, f"not JSON: {e}")
    validator = _validator(json.dumps(spec.json_schema, sort_keys=True))
    error = next(iter(validator.iter_errors(value)), None)
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(root)"
        return _verdict(spec, False, f"schema violation at {where}: {error.message[:200]}")
    return _verdict(spec, True, "valid JSON for the schema")


@lru_cache(maxsize=64)
def _verifier(path: str) -> Any:
    return load_function(path)


def grade_verifier(spec: VerifierSpec, text: str, reference: dict[str, Any] | None = None) -> RuleResult:
    """Call a user verifier. An exception is *no signal* (the verifier failed, not the response)."""
    try:
        out = _verifier(spec.function)(text, reference=reference, **spec.params)
    except Exception as e:  # noqa: BLE001 - user code: any failure is masked, never a reward of 0
        return RuleResult(0.0, False, f"verifier raised {type(e).__name__}: {str(e)[:200]}")
    if out is None:
        return RuleResult(0.0, False, "verifier returned no verdict")
    if isinstance(out, RuleResult):
        return out
    if isinstance(out, bool):
        return _verdict(spec, out, "verifier passed" if out else "verifier failed")
    if isinstance(out, tuple) and len(out) == 2:
        return RuleResult(float(out[0]), True, str(out[1]))
    if isinstance(out, int | float):
        return RuleResult(float(out), True, "verifier value")
    return RuleResult(0.0, False, f"verifier returned an unsupported {type(out).__name__}")
