"""shared/grading rule graders: each rule on a passing and a failing case, references, verifiers, errors."""

from __future__ import annotations

import pytest

from shared.grading import GraderConfigError, RuleResult, grade_rule


def verifier_len(text: str, reference: dict | None = None, *, max_words: int = 5) -> float | None:
    """Test verifier: 1.0 when short enough; None (no signal) for an empty response."""
    if not text:
        return None
    return 1.0 if len(text.split()) <= max_words else 0.0


def verifier_raises(text: str, reference: dict | None = None) -> bool:
    raise RuntimeError("verifier backend down")


def verifier_detail(text: str, reference: dict | None = None) -> tuple[float, str]:
    return 0.25, "quarter"


def test_exact_normalises_whitespace_and_case_only_when_asked() -> None:
    spec = {"name": "e", "type": "exact", "expected": "Form  B-7"}
    assert grade_rule(spec, "  Form B-7\n") == RuleResult(1.0, True, "exact match")
    assert grade_rule(spec, "form b-7").value == 0.0
    assert grade_rule({**spec, "ignore_case": True}, "form b-7").value == 1.0


def test_exact_from_reference_and_missing_reference_is_no_signal() -> None:
    spec = {"name": "e", "type": "exact", "reference_key": "answer", "on_fail": -1.0}
    assert grade_rule(spec, "42", reference={"answer": 42}).value == 1.0
    assert grade_rule(spec, "41", reference={"answer": 42}).value == -1.0
    r = grade_rule(spec, "42", reference=None)
    assert not r.has_signal and "answer" in r.detail


def test_contains_any_all_and_case() -> None:
    spec = {"name": "c", "type": "contains", "all_of": ["FORM-7"], "any_of": ["ext 12", "extension 12"]}
    assert grade_rule(spec, "Use FORM-7, extension 12").value == 1.0
    assert grade_rule(spec, "Use form-7, extension 12").value == 0.0
    assert grade_rule({**spec, "ignore_case": True}, "Use form-7, EXT 12").value == 1.0
    missing = grade_rule(spec, "Use FORM-7 please")
    assert missing.value == 0.0 and "none of" in missing.detail


def test_contains_reference_string_or_alternatives() -> None:
    spec = {"name": "c", "type": "contains", "reference_key": "answer", "ignore_case": True}
    assert grade_rule(spec, "It is 24 MONTHS", reference={"answer": "24 months"}).value == 1.0
    assert grade_rule(spec, "two years", reference={"answer": ["24 months", "two years"]}).value == 1.0
    assert grade_rule(spec, "a year", reference={"answer": ["24 months", "two years"]}).value == 0.0


def test_regex_search_and_fullmatch() -> None:
    assert grade_rule({"name": "r", "type": "regex", "pattern": r"\bFORM-\d+\b"}, "see FORM-12 now").value == 1.0
    full = {"name": "r", "type": "regex", "pattern": r"\d+", "match": "fullmatch"}
    assert grade_rule(full, " 123 ").value == 1.0
    assert grade_rule(full, "123 apples").value == 0.0


def test_json_schema_strict_lenient_and_violation() -> None:
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
    spec = {"name": "j", "type": "json_schema", "schema": schema}
    assert grade_rule(spec, '{"answer": 4}').value == 1.0
    assert grade_rule(spec, 'Sure!\n```json\n{"answer": 4}\n```').value == 1.0
    assert grade_rule({**spec, "lenient": False}, 'Sure! {"answer": 4}').value == 0.0
    bad = grade_rule(spec, '{"answer": "four"}')
    assert bad.value == 0.0 and "answer" in bad.detail
    assert grade_rule(spec, "no json here").detail.startswith("not JSON")


def test_verifier_values_none_raise_and_tuple() -> None:
    path = f"{__name__}:verifier_len"
    assert grade_rule({"name": "v", "type": "verifier", "function": path}, "one two").value == 1.0
    assert grade_rule({"name": "v", "type": "verifier", "function": path, "params": {"max_words": 1}},
                      "one two").value == 0.0
    assert not grade_rule({"name": "v", "type": "verifier", "function": path}, "").has_signal
    raised = grade_rule({"name": "v", "type": "verifier", "function": f"{__name__}.verifier_raises"}, "x")
    assert not raised.has_signal and "RuntimeError" in raised.detail
    assert grade_rule({"name": "v", "type": "verifier", "function": f"{__name__}:verifier_detail"}, "x") == \
        RuleResult(0.25, True, "quarter")


@pytest.mark.parametrize(("spec", "message"), [
    ({"name": "r", "type": "regex", "pattern": "("}, "invalid regular expression"),
    ({"name": "e", "type": "exact"}, "exactly one of `expected` or `reference_key`"),
    ({"name": "c", "type": "contains"}, "needs `any_of`, `all_of` or `reference_key`"),
    ({"name": "v", "type": "verifier", "function": "no_such_module_xyz:f"}, "cannot import module"),
    ({"name": "j", "type": "json_schema", "schema": {"type": "nonsense"}}, "not a valid JSON Schema"),
    ({"name": "k", "type": "kpi", "kpi": "resolved"}, "kpi"),
    ({"name": "x", "type": "levenshtein"}, "levenshtein"),
])
def test_invalid_specs_raise_clear_errors(spec: dict, message: str) -> None:
    with pytest.raises(GraderConfigError, match="invalid rule grader") as e:
        grade_rule(spec, "text")
    assert message in str(e.value)
