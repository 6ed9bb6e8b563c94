"""A tenant's own words (its products, places, and the staff who speak for it) --> kept by redaction.

Why: a backend's corrections and the model's answers name the business ("This is Trailmate support",
"Dana Whitfield at our returns desk approves it"). NER reads those as people, so without this every fact
that names them would reach the topics as "<PERSON> approves it" and could never be learned. The tenant
declares such names (`APPRENTICE_BUSINESS_NAMES`, shared/settings.py; a task file's `business_names:`), and
`BusinessNames.keep` drops the detections that are only those words.

What is exempt, and what is not:
- only a detection of a type in `EXEMPTIBLE` (PERSON), and only when it lies entirely inside an occurrence
  of a declared name in the text (case-insensitive, whole words), or inside declared names written next to
  each other that NER read as one span (a sign-off "Dana Whitfield\nTrailmate"). An end user who merely shares
  a word with a staff member ("Dana Smith" vs declared "Dana Whitfield") is a span with a word outside
  every occurrence, so it is still redacted, whole;
- e-mail addresses, phone numbers, cards, IBANs, IP addresses and SSNs are never exempt, even when they
  contain a declared word (dana.whitfield@trailmate.com): they reach a person or an account by themselves;
- names are matched literally (never as patterns) and only ever remove detections: a declared name cannot
  make anything else be kept, so the bounds below are about cost and typos, not about safety.

Names are per tenant: tenant A's declaration never exempts text captured for tenant B.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

from shared.privacy.detector import PERSON, Span

EXEMPTIBLE: frozenset[str] = frozenset({PERSON})
"""Types a declared name may exempt. Names only: structured identifiers (e-mail, phone, card, IBAN, IP, SSN)
identify a person or an account whatever words they contain."""

MAX_NAMES_PER_TENANT = 256
"""Declared names per tenant: a business has products, places and spokespeople, not a directory; each name
is one more alternative in the pattern matched against every captured text."""

MAX_NAME_CHARS = 100
"""Longest name (a product line or a full name with a title fits; a sentence does not)."""

MAX_TENANTS = 10_000
"""Tenants in one mapping (bounds what one environment variable makes every process compile)."""

_PATTERN_CHARS = set("*?\\|^$[]{}()<>")
"""Characters that would make a name read as a wildcard, a regular expression or a redaction placeholder."""


def clean_name(name: object) -> str:
    """`name` with its whitespace collapsed; raises ValueError saying why it cannot be a business name."""
    if not isinstance(name, str):
        raise ValueError(f"a name must be a string, got {type(name).__name__}")
    clean = " ".join(name.split())
    if not clean:
        raise ValueError("a name may not be empty")
    if len(clean) > MAX_NAME_CHARS:
        raise ValueError(f"name {clean[:40]!r}... is longer than {MAX_NAME_CHARS} characters")
    if bad := sorted(set(clean) & _PATTERN_CHARS):
        raise ValueError(f"name {clean!r} contains {''.join(bad)!r}: names are matched literally, as whole "
                         "words; write each name out instead of a pattern")
    if not any(c.isalpha() for c in clean):
        raise ValueError(f"name {clean!r} has no letter: a name is words, not a pattern or a number")
    if len(clean) < 2:
        raise ValueError(f"name {clean!r} is shorter than 2 characters")
    if any(not c.isprintable() for c in clean):
        raise ValueError(f"name {clean!r} contains a control character")
    return clean


def clean_names(names: Iterable[object]) -> tuple[str, ...]:
    """Validated names, duplicates (ignoring case) dropped, in the order given; raises ValueError naming the
    bad entry or the count."""
    if isinstance(names, str):
        raise ValueError("names must be a list of strings, not one string")
    out: dict[str, str] = {}
    for n, name in enumerate(names, start=1):
        try:
            clean = clean_name(name)
        except ValueError as e:
            raise ValueError(f"name {n}: {e}") from None
        out.setdefault(clean.casefold(), clean)
    if len(out) > MAX_NAMES_PER_TENANT:
        raise ValueError(f"{len(out)} names; at most {MAX_NAMES_PER_TENANT} per tenant")
    return tuple(out.values())


def parse_business_names(mapping: Mapping[str, Iterable[object]]) -> dict[str, tuple[str, ...]]:
    """`{tenant: [names]}` --> validated names per tenant; raises ValueError naming the tenant and entry."""
    if not isinstance(mapping, Mapping):
        raise ValueError("expected an object {tenant: [names]}")
    if len(mapping) > MAX_TENANTS:
        raise ValueError(f"{len(mapping)} tenants; at most {MAX_TENANTS}")
    out: dict[str, tuple[str, ...]] = {}
    for tenant, names in mapping.items():
        if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 128:
            raise ValueError(f"tenant {tenant!r} must be a non-empty name of at most 128 characters")
        try:
            out[tenant] = clean_names(names)
        except (TypeError, ValueError) as e:
            raise ValueError(f"tenant {tenant!r}: {e}") from None
    return out


def _name_pattern(name: str) -> str:
    """One name as a regex: its words literally, any run of whitespace between them, either apostrophe."""
    words = []
    for word in name.split():
        words.append("".join("['\u2019]" if c in "'\u2019" else re.escape(c) for c in word))
    return r"\s+".join(words)


class BusinessNames:
    """One tenant's declared names, compiled once (`BusinessNames.of` caches per distinct list)."""

    __slots__ = ("_pattern", "key", "names")

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names: tuple[str, ...] = clean_names(names) if names else ()
        # longest first: where two names start at one position, the longer occurrence is the one matched
        alternatives = sorted((_name_pattern(n) for n in self.names), key=len, reverse=True)
        # a lookahead, so occurrences that overlap ("Harbor Point" / "Point Reyes") are all found
        self._pattern = (re.compile(rf"(?<!\w)(?=((?:{'|'.join(alternatives)}))(?!\w))", re.IGNORECASE)
                         if alternatives else None)
        self.key: bytes = (hashlib.blake2b("\x1f".join(sorted(n.casefold() for n in self.names)).encode(),
                                           digest_size=16).digest() if self.names else b"")
        """Part of every cache key of a scan under these names (b"" when there are none)."""

    @classmethod
    def of(cls, names: Iterable[str]) -> BusinessNames:
        """The compiled names (one instance per distinct list: settings ask for them on every capture)."""
        return _compiled(tuple(names))

    def __bool__(self) -> bool:
        return bool(self.names)

    def __repr__(self) -> str:
        return f"BusinessNames({list(self.names)!r})"

    def occurrences(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of every occurrence of a declared name in `text`, whole words, any case."""
        if self._pattern is None or not text:
            return []
        return [(m.start(1), m.end(1)) for m in self._pattern.finditer(text)]

    def covers(self, text: str, start: int, end: int, occurrences: Sequence[tuple[int, int]] | None = None) -> bool:
        """Every letter and digit of `text[start:end]` (less a possessive "'s") lies inside an occurrence of a
        declared name: one name, or names written next to each other that NER read as one ("Regards,\\nDana
        Reyes\\nTrailmate"). A word outside every occurrence ("Smith" in "Dana Whitfield Smith") leaves the
        span uncovered."""
        occ = self.occurrences(text) if occurrences is None else occurrences
        if not occ:
            return False
        if end - start > 2 and text[end - 2] in "'\u2019" and text[end - 1] in "sS":
            end -= 2
        letters = [i for i in range(start, end) if text[i].isalnum()]
        return bool(letters) and all(any(a <= i < b for a, b in occ) for i in letters)

    def keep(self, text: str, spans: Iterable[Span]) -> list[Span]:
        """`spans` less the exemptible ones that are only a declared name (what redaction then removes)."""
        spans = list(spans)
        if self._pattern is None or not any(s.entity in EXEMPTIBLE for s in spans):
            return spans
        occ = self.occurrences(text)
        return [s for s in spans if s.entity not in EXEMPTIBLE or not self.covers(text, s.start, s.end, occ)]


@functools.lru_cache(maxsize=1024)
def _compiled(names: tuple[str, ...]) -> BusinessNames:
    return BusinessNames(names)


NO_NAMES = BusinessNames()
"""A tenant that declared nothing: every detection is redacted."""
