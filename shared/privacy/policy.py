"""Text + a tenant's policy --> what may be kept: the text with personal data replaced by typed
placeholders (`redact`), a refusal naming the types found (`reject`), or the text as it is (`keep`).

`Redactor` puts a detector behind a small cache: a conversation re-sends its earlier messages with each
turn, and `n` samples of one request share a prompt, so most scans of captured text are repeats.
Every scan takes the tenant's declared public business data (`shared.privacy.business`: its names, phone
numbers, e-mail, web and street addresses): the detections that are only those values are kept in the text, so
a scan's result depends on the text *and* the declaration, and the cache is keyed by both (one tenant's
declaration must never decide what is kept of another tenant's text).
The key also holds the tenant itself: a hit answers in a fraction of a scan's time, so a cache shared across
tenants would tell tenant B, by its latency alone, that tenant A had sent the same text
(tests/security/test_cache_isolation.py).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from shared.privacy.business import NO_DATA, BusinessData
from shared.privacy.detector import PERSON, PiiDetector, Span, conversation_pairs, joins, resolve_overlaps
from shared.privacy.instance import get_detector


class PiiPolicy(StrEnum):
    REDACT = "redact"     # replace each span with <ENTITY_TYPE> in what is kept
    REJECT = "reject"     # refuse input that contains personal data (INVALID_ARGUMENT, types named)
    KEEP = "keep"         # keep text as it is (a tenant with its own agreement for this data)


def parse_tenant_policies(spec: str) -> dict[str, PiiPolicy]:
    """`tenantA:keep,tenantB:reject` --> {tenant: policy}; raises ValueError naming the bad entry."""
    out: dict[str, PiiPolicy] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        tenant, sep, name = (x.strip() for x in item.rpartition(":"))
        if not sep or not tenant:
            raise ValueError(f"entry {item!r} must be `tenant:policy`")
        if tenant in out:
            raise ValueError(f"tenant {tenant!r} is listed twice")
        try:
            out[tenant] = PiiPolicy(name.lower())
        except ValueError:
            raise ValueError(f"entry {item!r}: policy must be one of "
                             f"{', '.join(p.value for p in PiiPolicy)}; got {name!r}") from None
    return out


def placeholder(entity: str) -> str:
    return f"<{entity}>"


def redact(text: str, spans: Iterable[Span]) -> str:
    """`text` with each (non-overlapping) span replaced by its placeholder, e.g. `<EMAIL_ADDRESS>`."""
    out, pos = [], 0
    for s in sorted(spans, key=lambda s: s.start):
        out.append(text[pos:s.start])
        out.append(placeholder(s.entity))
        pos = s.end
    out.append(text[pos:])
    return "".join(out)


def entity_types(spans: Iterable[Span]) -> list[str]:
    """Distinct types, sorted (what a refusal names: never the values)."""
    return sorted({s.entity for s in spans})


@dataclass(frozen=True)
class Scan:
    text: str
    spans: tuple[Span, ...]

    @property
    def redacted(self) -> str:
        return redact(self.text, self.spans) if self.spans else self.text

    @property
    def types(self) -> list[str]:
        return entity_types(self.spans)

    def names(self) -> set[str]:
        """The words of the PERSON spans ("Dana Whitfield" -> {"Dana", "Whitfield"})."""
        return {w.strip(".,'\u2019-") for s in self.spans if s.entity == PERSON
                for w in self.text[s.start:s.end].split() if len(w.strip(".,'\u2019-")) >= 2}


class Redactor:
    """A detector with an LRU cache of results keyed by a hash of the tenant, the text and the business data
    the result was filtered by (thread-safe). Keyed by tenant so no tenant's scan is served from (and timed
    by) another tenant's."""

    def __init__(self, detector: Callable[[], PiiDetector] = get_detector, cache_size: int = 4096) -> None:
        self._detector = detector
        self._cache: OrderedDict[bytes, tuple[Span, ...]] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Build the detector now (seconds) rather than on the first captured request."""
        self._detector().find("warm-up: Dana Whitfield, dana@example.com")

    @staticmethod
    def cache_key(text: str, *, tenant: str, names: bool = True, business: BusinessData = NO_DATA) -> bytes:
        """The cache key of one scan: the tenant, the text, the kind of scan and the business data. The
        tenant is hashed length-prefixed with the text so no (tenant, text) pair collides with another."""
        t = tenant.encode("utf-8", "surrogatepass")
        h = hashlib.blake2b(digest_size=16, person=b"names" if names else b"structured")
        h.update(len(t).to_bytes(4, "big") + t)
        h.update(text.encode("utf-8", "surrogatepass"))
        return h.digest() + business.key

    def scan(self, text: str, *, tenant: str, names: bool = True, business: BusinessData = NO_DATA) -> Scan:
        """The detector's spans of `text` sent by `tenant` (cached per tenant), less those that are only
        the tenant's declared `business` data; `names=False`: structured types only."""
        if not text:
            return Scan(text, ())
        key = self.cache_key(text, tenant=tenant, names=names, business=business)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return Scan(text, hit)
        spans = tuple(business.keep(text, self._detector().find(text, names=names)))
        with self._lock:
            self._cache[key] = spans
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return Scan(text, spans)

    def scan_conversation(self, texts: list[str], roles: list[str], *, tenant: str,
                          business: BusinessData = NO_DATA) -> list[Scan]:
        """One scan per message of a conversation, each also holding its part of a structured value split
        across two messages (`PiiDetector.find_conversation`: "jane.doe@exa" / "mple.com", an IBAN or phone
        number in two halves), between neighbours and between a message and the next of its role
        (`conversation_pairs`). Every scan, joined or not, goes through the tenant's cache: a conversation
        re-sends its earlier turns, so only the newest message and its joins are read again."""
        scans = [self.scan(t, tenant=tenant, business=business) for t in texts]
        extra: list[list[Span]] = [[] for _ in texts]
        for join in joins(texts, conversation_pairs(roles)):
            for i, span in join.pieces(self.scan(join.text, tenant=tenant, names=False, business=business).spans):
                extra[i].append(span)
        return [scan if not more else Scan(scan.text, tuple(resolve_overlaps([*scan.spans, *more])))
                for scan, more in zip(scans, extra, strict=True)]

    def scan_answer(self, text: str, names: Iterable[str], business: BusinessData = NO_DATA, *,
                    tenant: str) -> Scan:
        """A model's answer: every structured type (e-mail, phone, card, IBAN, IP, SSN), and as names only
        the `names` the conversation gave (matched as whole, case-sensitive words: "Thanks, Dana!"), except
        where such a word is part of a declared business value ("Dana" from a user's "Dana Smith" inside
        "ask Dana Whitfield"); a declared phone, e-mail, web or street address is kept too. Answers are not read with NER: an answer about a public figure is not
        personal data, and NER reads names into the random text of small or early models."""
        spans = list(self.scan(text, tenant=tenant, names=False, business=business).spans)
        found = []
        for name in names:
            found += [Span(m.start(), m.end(), PERSON, 0.85)
                      for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text)]
        spans += business.keep(text, found)
        return Scan(text, tuple(resolve_overlaps(spans)))
