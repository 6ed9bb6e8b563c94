"""Labelled strings + a detector --> recall and precision per entity type (the PII detector's report card).

A labelled line is `{"text": ..., "entities": [{"type", "start", "end", "value"}]}`. Scoring is by what
redaction needs, not by exact boundaries:
- recall: a labelled entity is found when detections of its type cover every letter and digit of it
  (a card redacted but for its last four digits is a miss);
- precision: a detection is right when it overlaps a labelled entity of its type (a detection of
  another type, or on a string with no personal data, is a false positive).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from shared.privacy.business import NO_DATA, BusinessData
from shared.privacy.detector import ENTITIES, PiiDetector, Span


@dataclass(frozen=True)
class Labelled:
    text: str
    entities: tuple[Span, ...]


@dataclass
class TypeScore:
    true_pos: int = 0         # labelled entities found (recall numerator)
    labelled: int = 0         # labelled entities
    correct: int = 0          # detections that hit a labelled entity of their type (precision numerator)
    detected: int = 0         # detections
    misses: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.true_pos / self.labelled if self.labelled else 1.0

    @property
    def precision(self) -> float:
        return self.correct / self.detected if self.detected else 1.0


def load_labelled(path: Path | str) -> list[Labelled]:
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        ents = tuple(Span(e["start"], e["end"], e["type"]) for e in row["entities"])
        for e, raw in zip(ents, row["entities"], strict=True):
            assert row["text"][e.start:e.end] == raw["value"], f"{path}:{n}: span does not match its value"
        out.append(Labelled(row["text"], ents))
    return out


def _covered(text: str, gold: Span, found: Iterable[Span]) -> bool:
    covered: set[int] = set()
    for s in found:
        if s.entity == gold.entity:
            covered.update(range(s.start, s.end))
    return all(i in covered for i in range(gold.start, gold.end) if text[i].isalnum())


def score(detector: PiiDetector, examples: list[Labelled], business: BusinessData = NO_DATA) -> dict[str, TypeScore]:
    """Per-type scores of `detector` on `examples`, as redaction under a tenant's declared `business` data
    would apply it (the detections that are only declared values are kept in the text, so they do not count)."""
    scores = {t: TypeScore() for t in ENTITIES}
    for ex, raw in zip(examples, detector.find_many([e.text for e in examples]), strict=True):
        found = business.keep(ex.text, raw)
        for g in ex.entities:
            sc = scores.setdefault(g.entity, TypeScore())
            sc.labelled += 1
            if _covered(ex.text, g, found):
                sc.true_pos += 1
            else:
                sc.misses.append(f"{ex.text[g.start:g.end]!r} in {ex.text!r}")
        for s in found:
            sc = scores.setdefault(s.entity, TypeScore())
            sc.detected += 1
            if any(g.entity == s.entity and g.overlaps(s) for g in ex.entities):
                sc.correct += 1
            else:
                sc.false_alarms.append(f"{ex.text[s.start:s.end]!r} in {ex.text!r}")
    return scores


def overall(scores: dict[str, TypeScore]) -> TypeScore:
    """Micro-average over every type."""
    total = TypeScore()
    for sc in scores.values():
        total.true_pos += sc.true_pos
        total.labelled += sc.labelled
        total.correct += sc.correct
        total.detected += sc.detected
    return total
