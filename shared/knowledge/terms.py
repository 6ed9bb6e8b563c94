"""An item's text and questions --> the terms a correct answer contains, and the check on an answer.

The eval gate decides whether a candidate's weights hold an item by asking the item's questions without the
item in context and checking each answer for the item's *answer terms*: the distinctive words of the item's
text that its questions do not already hold (a code like RF-7734, a number like 4410 or 18-month, a name
like Tidepool). No task-specific checker is needed, so the same rule works for any tenant's knowledge.

Terms, in order of strength:
1. tokens with a digit (codes, numbers, durations, prices);
2. capitalised words that are not the first word of a sentence (names of products, places, people);
3. when neither exists: up to four content words of five or more letters.
Words that appear in any of the item's questions are dropped from 2 and 3 (a question's own words in the
answer prove nothing). An answer holds the item when at least half of its terms (rounded up) appear in it,
compared on lower-cased alphanumeric text, also with separators removed (RF-7734 = RF7734 = rf 7734).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

MAX_TERMS = 6
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’\-]*[A-Za-z0-9]|[A-Za-z0-9]")
_SENTENCE_END = re.compile(r"[.!?;:]\s*$")
_STOP = frozenset(["about", "above", "after", "again", "against", "before", "being", "below", "between", "could", "customer", "customers", "every", "from", "have", "having", "here", "into", "itself", "just", "more", "most", "only", "other", "ours", "ourselves", "should", "some", "such", "than", "that", "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "under", "until", "very", "what", "when", "where", "which", "while", "who", "whom", "will", "with", "would", "your", "yours", "always", "need", "needs", "please", "thank", "thanks", "there's"])


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def _words(texts: Iterable[str]) -> set[str]:
    return {w for t in texts for w in _norm(t).split()}


def answer_terms(text: str, questions: Sequence[str] = ()) -> list[str]:
    """The item's answer terms (see the module docstring), at most MAX_TERMS, in text order."""
    asked = _words(questions)
    strong: list[str] = []
    names: list[str] = []
    content: list[str] = []
    prev_end = 0
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        sentence_start = not text[prev_end:m.start()].strip() and prev_end == 0 or bool(
            _SENTENCE_END.search(text[:m.start()]))
        prev_end = m.end()
        parts = _norm(tok).split()
        if not parts:
            continue
        if any(ch.isdigit() for ch in tok):
            strong.append(tok)
        elif tok[0].isupper() and not sentence_start and not set(parts) <= asked and tok.lower() not in _STOP:
            names.append(tok)
        elif len(tok) >= 5 and tok.isalpha() and tok.lower() not in _STOP and tok.lower() not in asked:
            content.append(tok)
    chosen = strong + names if strong or names else content[:4]
    out: list[str] = []
    for t in chosen:
        if _norm(t) not in {_norm(o) for o in out}:
            out.append(t)
    return out[:MAX_TERMS]


def term_in(term: str, answer: str) -> bool:
    """`term` appears in `answer` as whole words, or with separators removed (codes written either way)."""
    t, a = _norm(term), _norm(answer)
    if not t:
        return False
    tail = "(?![0-9])" if t[-1].isdigit() else ""     # 4410 is not 44100; "18 month" is in "18 months"
    if re.search(rf"(?<![0-9a-z]){re.escape(t)}{tail}", a):
        return True
    compact_t = t.replace(" ", "")
    return len(compact_t) >= 4 and re.search(rf"{re.escape(compact_t)}{tail}", a.replace(" ", "")) is not None


def answer_holds(answer: str, terms: Sequence[str]) -> bool:
    """True when at least half of `terms` (rounded up) appear in `answer`; False for an item with no terms
    (nothing to check means nothing shown)."""
    if not terms:
        return False
    hits = sum(term_in(t, answer) for t in terms)
    return hits >= math.ceil(len(terms) / 2)
