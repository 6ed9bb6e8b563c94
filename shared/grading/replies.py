"""How two replies are compared as "the same answer": case, spacing and surrounding punctuation ignored.

One definition for the grader's `constant_reply` detector (services/grader/core/detectors.py) and the demo's
collapse check (tools/demo/evaluation.py), so both call the same replies alike.
"""

from __future__ import annotations


def reply_key(text: str) -> str:
    """`text` lower-cased, its whitespace runs collapsed to one space, end punctuation and quotes stripped."""
    return " ".join(text.lower().split()).strip(" .,;:!?\"'")
