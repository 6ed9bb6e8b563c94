"""An item's recorded questions --> the ones that train and the ones the weights gate asks, by one rule that
the trainer and the gate share.

An item leaves the serving context once a promoted version answers its questions without it
(services/extractor/consolidation.py). If the gate asked the very questions consolidation drilled, that would
show the weights memorised those phrasings, not that they hold the fact: so, of an item's distinct recorded
questions (first spelling kept, compared on lower-cased words), every third one (the 3rd, 6th, ...) is held
for the gate's check and never trained on, nor paraphrased. An item with fewer than three questions has
nothing to spare: all of them train and all are asked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def question_key(text: str) -> str:
    """A question compared on lower-cased words (punctuation and spacing ignored)."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def split_questions(questions: Iterable[str]) -> tuple[list[str], list[str]]:
    """(train, check): see the module docstring. Order is kept; duplicates count once."""
    distinct: dict[str, str] = {}
    for q in questions:
        text = " ".join(q.split())
        key = question_key(text)
        if key and key not in distinct:
            distinct[key] = text
    qs = list(distinct.values())
    if len(qs) < 3:
        return qs, qs
    check = qs[2::3]
    return [q for i, q in enumerate(qs) if i % 3 != 2], check
