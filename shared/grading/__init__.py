"""Grader configuration and the pure rule graders, shared by the grader service and the weights eval gate.

    from shared.grading import grade_rule, load_grader_config
    grade_rule({"name": "fact", "type": "contains", "reference_key": "answer", "ignore_case": True},
               text, reference={"answer": "FORM-7"})  # -> RuleResult(value=1.0, has_signal=True, ...)

The API here is stable: add, do not change.
"""

from shared.grading.rules import RuleResult, extract_json, grade_rule, parse_rule_spec
from shared.grading.schema import (
    FEEDBACK_TYPES,
    RULE_TYPES,
    ContainsSpec,
    DetectorConfig,
    ExactSpec,
    FeedbackSpec,
    GraderConfig,
    GraderConfigError,
    GraderSpec,
    JsonSchemaSpec,
    JudgeSpec,
    KpiSpec,
    RegexSpec,
    RuleSpec,
    TaskGraders,
    VerifierSpec,
    load_function,
    load_grader_config,
    parse_grader_config,
)

__all__ = [
    "FEEDBACK_TYPES", "RULE_TYPES", "ContainsSpec", "DetectorConfig", "ExactSpec", "FeedbackSpec",
    "GraderConfig", "GraderConfigError", "GraderSpec", "JsonSchemaSpec", "JudgeSpec", "KpiSpec", "RegexSpec",
    "RuleResult", "RuleSpec", "TaskGraders", "VerifierSpec", "extract_json", "grade_rule", "load_function",
    "load_grader_config", "parse_grader_config", "parse_rule_spec",
]
