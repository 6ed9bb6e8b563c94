"""A group of responses to one prompt + a rubric --> judge prompt --> judge text --> scores in [0, 1] (pure).

RULER (OpenPipe ART) observed that an LLM judges *relative* quality far more reliably than absolute
quality: shown all responses to the same prompt side by side, it ranks them consistently even when
its absolute scores drift. GRPO only needs relative rewards within a group anyway. So when an
interaction belongs to a group (`group_id`, the n samples of one request) the judge sees the whole
group at once and scores each response 0..10 against the rubric and against the others; a single
response is scored on its own.

The judge's answer is JSON `{"scores": [s_1, ..., s_n]}`; lines like `[2] 7` or `Response 2: 7/10` are
accepted as a fallback. Anything else is *no signal* for every member (a judge that cannot be read
must not produce rewards).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shared.grading import extract_json
from shared.proto.apprentice.v1 import events_pb2

SYSTEM = ("You are a strict, fair grader. You compare responses to the same request and score each one "
          "against the rubric. You answer with JSON only.")
MAX_RESPONSE_CHARS = 2000
_LINE = re.compile(r"(?:\[|response\s*#?\s*)(\d+)\]?\s*[:=\-]?\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


@dataclass(frozen=True)
class JudgeScore:
    interaction_id: str
    value: float
    has_signal: bool
    detail: str


def _request_text(interaction: events_pb2.Interaction) -> str:
    if interaction.messages:
        return "\n".join(f"{m.role}: {m.content}" for m in interaction.messages if m.role != "system")
    return interaction.prompt_text


def build_messages(rubric: str, members: Sequence[events_pb2.Interaction]) -> list[tuple[str, str]]:
    """(role, content) chat messages asking for one score per member, in member order."""
    assert members, "a judge call needs at least one response"
    lines = [f"Rubric:\n{rubric.strip()}", "", f"Request:\n{_request_text(members[0])}", ""]
    for i, m in enumerate(members, 1):
        lines += [f"[{i}] Response {i}:", m.response_text[:MAX_RESPONSE_CHARS], ""]
    n = len(members)
    if n > 1:
        lines.append(f"Score each of the {n} responses from 0 (useless) to 10 (perfect) against the rubric, "
                     "relative to each other: the best gets the highest score.")
    else:
        lines.append("Score the response from 0 (useless) to 10 (perfect) against the rubric.")
    lines.append(f'Answer with JSON only: {{"scores": [{", ".join(f"<score {i}>" for i in range(1, n + 1))}]}}')
    return [("system", SYSTEM), ("user", "\n".join(lines))]


def parse_scores(text: str, n: int) -> list[float] | None:
    """n scores in [0, 10] from the judge's text, or None when it cannot be read."""
    try:
        data = extract_json(text, lenient=True)
        raw = data.get("scores") if isinstance(data, dict) else data
        if isinstance(raw, list) and len(raw) == n and all(isinstance(x, int | float) for x in raw):
            scores = [float(x) for x in raw]
            if all(0.0 <= s <= 10.0 for s in scores):
                return scores
    except ValueError:
        pass
    found: dict[int, float] = {}
    for m in _LINE.finditer(text):
        idx, score = int(m.group(1)), float(m.group(2))
        if 1 <= idx <= n and 0 <= score <= 10 and idx not in found:
            found[idx] = score
    if len(found) == n:
        return [found[i] for i in range(1, n + 1)]
    return None


def score_group(members: Sequence[events_pb2.Interaction], judge_text: str | None,
                error: str | None = None) -> list[JudgeScore]:
    """Judge output --> one JudgeScore per member (value = score / 10); no signal when unreadable."""
    if judge_text is None:
        why = f"judge call failed: {error}" if error else "judge call failed"
        return [JudgeScore(m.interaction_id, 0.0, False, why) for m in members]
    scores = parse_scores(judge_text, len(members))
    if scores is None:
        snippet = judge_text.strip().replace("\n", " ")[:120]
        return [JudgeScore(m.interaction_id, 0.0, False, f"judge output unreadable: {snippet!r}")
                for m in members]
    kind = f"relative, group of {len(members)}" if len(members) > 1 else "absolute"
    return [JudgeScore(m.interaction_id, s / 10.0, True, f"judge {s:g}/10 ({kind})")
            for m, s in zip(members, scores, strict=True)]
