"""Text --> the spans of personal data in it (typed, non-overlapping). The detector contract.

One detector serves every place that keeps text: inference capture (prompts, answers, feedback
comments) and the extractor's knowledge filter, so they agree on what personal data is. Implementations
are chosen by `create_detector(name)`; `get_detector()` builds the configured one once per process,
lazily (the spaCy pipeline takes seconds to load), and is safe to call from any thread.
"""

from __future__ import annotations

import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass

# Entity types, named as Presidio names them (they become the redaction placeholders, e.g. <EMAIL_ADDRESS>).
EMAIL = "EMAIL_ADDRESS"
PHONE = "PHONE_NUMBER"
CARD = "CREDIT_CARD"
IBAN = "IBAN_CODE"
IP = "IP_ADDRESS"
PERSON = "PERSON"
SSN = "US_SSN"
SESSION_ID = "SESSION_ID"
"""A UUID, or a long token named as a session/account/user id (shared/privacy/recognizers.py)."""
ENTITIES: tuple[str, ...] = (EMAIL, PHONE, CARD, IBAN, IP, PERSON, SSN, SESSION_ID)

# Which type wins when two detections overlap: the checksummed and structured ones first (a card number
# also parses as a phone number; an e-mail's local part may read as a name), names last.
PRIORITY: dict[str, int] = {EMAIL: 7, CARD: 6, IBAN: 5, SSN: 4, IP: 3, SESSION_ID: 3, PHONE: 2, PERSON: 1}


@dataclass(frozen=True)
class Span:
    """`text[start:end]` is personal data of type `entity` (detector confidence `score`, 0-1)."""

    start: int
    end: int
    entity: str
    score: float = 1.0

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end


def resolve_overlaps(spans: list[Span]) -> list[Span]:
    """Non-overlapping spans in text order: on overlap the higher-priority type wins, then the higher
    score, then the longer span."""
    ranked = sorted(spans, key=lambda s: (-PRIORITY.get(s.entity, 0), -s.score, -(s.end - s.start), s.start))
    kept: list[Span] = []
    for s in ranked:
        if all(not s.overlaps(k) for k in kept):
            kept.append(s)
    return sorted(kept, key=lambda s: s.start)


class PiiDetector(ABC):
    """Finds personal data in text. Implementations must be safe to call from many threads."""

    name: str = ""

    @abstractmethod
    def find(self, text: str, *, names: bool = True) -> list[Span]:
        """The personal-data spans of `text`: non-overlapping, sorted by start. `names=False`: the
        structured types only (no PERSON, and none of the cost of reading names)."""

    def find_many(self, texts: list[str]) -> list[list[Span]]:
        """`find` for each text (implementations may batch)."""
        return [self.find(t) for t in texts]

    def find_conversation(self, texts: list[str]) -> list[list[Span]]:
        """`find` for each message of one conversation, plus the structured values split across two
        adjacent messages ("my email is jane.doe@exa" / "mple.com"): each pair is scanned joined (with no
        glue and with one space) and a detection that crosses the join is kept as its piece in each
        message. Names are not joined (two messages "I am Jane" / "Doe" are read alone)."""
        per = [list(x) for x in self.find_many(texts)]
        for join in joins(texts, adjacent_pairs(len(texts))):
            for i, span in join.pieces(self.find(join.text, names=False)):
                per[i].append(span)
        return [resolve_overlaps(x) for x in per]


def adjacent_pairs(n: int) -> list[tuple[int, int]]:
    """(i, i + 1) for each two neighbouring messages of `n`."""
    return [(i, i + 1) for i in range(n - 1)]


def conversation_pairs(roles: list[str]) -> list[tuple[int, int]]:
    """The message pairs a split value can straddle: neighbours, and each message with the next one of the
    same role (a user who sends "jane.doe@exa", gets an answer, then sends "mple.com" split it too)."""
    pairs = set(adjacent_pairs(len(roles)))
    for i, role in enumerate(roles):
        j = next((k for k in range(i + 1, len(roles)) if roles[k] == role), None)
        if j is not None:
            pairs.add((i, j))
    return sorted(pairs)


@dataclass(frozen=True)
class Join:
    """Messages `first` and `second` scanned as one text (`text` = first + glue + second, the second
    starting at `head`); `pieces` maps a detection of `text` that crosses the glue back to its two parts."""

    first: int
    second: int
    text: str
    cut: int
    head: int

    def pieces(self, spans: list[Span] | tuple[Span, ...]) -> list[tuple[int, Span]]:
        """(message index, span in that message) for each detection that crosses the join."""
        out = []
        for s in spans:
            if s.start < self.cut and s.end > self.head:
                out.append((self.first, Span(s.start, self.cut, s.entity, s.score)))
                out.append((self.second, Span(0, s.end - self.head, s.entity, s.score)))
        return out


def joins(texts: list[str], pairs: list[tuple[int, int]]) -> list[Join]:
    """The joined texts to scan for values split across the `pairs` of messages: each pair whose facing
    edges could be halves of one value, with no glue and with one space between them."""
    out = []
    for i, j in pairs:
        a, b = texts[i], texts[j]
        if a and b and _JOINABLE(a[-1]) and _JOINABLE(b[0]):
            out += [Join(i, j, a + glue + b, len(a), len(a) + len(glue)) for glue in ("", " ")]
    return out


def _JOINABLE(c: str) -> bool:  # noqa: N802 - reads as the predicate it is
    """A message edge that can be half of a split value: a letter or digit, or an address's punctuation."""
    return c.isalnum() or c in "@.+-_("


def detection_view(text: str) -> str:
    """`text` as the recognizers read it, of the same length (a span of the view is the same span of the
    text): every Unicode decimal digit (full-width, Devanagari, Arabic-Indic...) as its ASCII digit, and
    every character whose NFKC form is one character (full-width letters and punctuation, "（" -> "(")
    as that character. ASCII text is returned as is."""
    if text.isascii():
        return text
    out = []
    for c in text:
        d = unicodedata.decimal(c, None)
        if d is not None:
            out.append(str(d))
            continue
        n = unicodedata.normalize("NFKC", c)
        out.append(n if len(n) == 1 else c)
    return "".join(out)
