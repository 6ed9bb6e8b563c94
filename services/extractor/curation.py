"""Candidate items + the current items --> accepted / merged / rejected, and the token cap.

Rules (OEL accumulation plus ACE-style curation):
- a candidate is rejected when it is too short or too long, does not read as text, or carries personal data;
- an exact duplicate (same normalised text) or near duplicate (word-set Jaccard >= threshold, or embedding
  cosine >= threshold when an embedder is configured, unless the two state different values) is merged
  into the existing item: its provenance grows, no new item appears. Rejected items take part, so a rejected rule is not proposed again;
- the same fact in other words is merged too: the same subject (`same_subject`) and no answer term the item
  lacks (shared/knowledge/terms.py: the code, number or name the fact is about);
- a contradiction is the same subject with disjoint answer terms (the warranty is 18 months / 24 months):
  `contradicts` tells the store, which retires the older item when the newer one is approved;
- the active items (proposed + approved) are capped in tokens: items whose harmful count exceeds helpful
  by `harmful_margin` go first, then the oldest proposals, then the oldest approved items (OEL keeps the
  newest); pinned items are exempt.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.extractor.parser import looks_like_text
from services.extractor.pii import find_pii
from shared.knowledge.terms import answer_terms, term_in
from shared.privacy.business import NO_DATA, BusinessData
from shared.proto.apprentice.v1 import events_pb2

S = events_pb2.ItemStatus
ACTIVE = (S.ITEM_STATUS_PROPOSED, S.ITEM_STATUS_APPROVED, S.ITEM_STATUS_CONSOLIDATED)
TRAINING = (S.ITEM_STATUS_APPROVED, S.ITEM_STATUS_PINNED, S.ITEM_STATUS_CONSOLIDATED)
"""Reviewed items: they train, and APPROVED/PINNED ones also serve in context (CONSOLIDATED ones no longer
need to: the promoted weights hold them)."""

TokenCounter = Callable[[str], int]


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-norm vectors, one per text."""


def approx_tokens(text: str) -> int:
    """~4 characters per token: the fallback counter when no tokenizer is at hand."""
    return max(1, (len(text) + 3) // 4)


def normalise(text: str) -> str:
    """Case, punctuation, markers and spacing removed: the identity of an item's meaning."""
    t = re.sub(r"^\s*-?\s*experience item\s*:\s*", "", text, flags=re.IGNORECASE)
    t = re.sub(r"[^\w\s]", " ", t.lower())
    return re.sub(r"\s+", " ", t).strip()


def item_id(text: str) -> str:
    """Stable id: hash of the normalised first text (edits keep the id)."""
    return hashlib.sha256(normalise(text).encode()).hexdigest()[:12]


_STOP = {"a", "an", "the", "to", "of", "and", "or", "in", "on", "for", "is", "are", "be", "it", "that", "this",
         "with", "as", "by", "at", "when", "if", "you", "your", "always", "should"}


def word_set(text: str) -> set[str]:
    return {w for w in normalise(text).split() if w not in _STOP}


def jaccard(a: str, b: str) -> float:
    wa, wb = word_set(a), word_set(b)
    if not wa or not wb:
        return 1.0 if normalise(a) == normalise(b) else 0.0
    return len(wa & wb) / len(wa | wb)


@dataclass
class Verdict:
    """What curation decided about one candidate."""

    text: str
    outcome: str                    # added | merged | rejected
    reason: str = ""                # why rejected, or "exact"/"near"/"embedding" for merges
    item_id: str = ""
    flags: tuple[str, ...] = ()     # injection-screen flags of an added item (it then waits for review)


@dataclass
class Curator:
    min_chars: int = 12
    max_chars: int = 400
    near_threshold: float = 0.8
    embedding_threshold: float = 0.9
    harmful_margin: int = 3
    count_tokens: TokenCounter = approx_tokens
    embedder: Embedder | None = None
    embedding_cache_size: int = 20_000
    """Texts whose embeddings are kept (least recently used dropped): every comparison embeds both sides, and a
    long-running extractor sees an unbounded stream of texts."""
    _emb_cache: OrderedDict[str, list[float]] = field(default_factory=OrderedDict, repr=False)

    def rejection(self, text: str, names: Sequence[str] = (), business: BusinessData = NO_DATA) -> str:
        """Why a candidate may not enter a base ("" = acceptable). `business`: the base's tenant's declared
        public business data, which is not personal data (services/extractor/pii.py)."""
        if len(text) < self.min_chars:
            return f"too short ({len(text)} < {self.min_chars} chars)"
        if len(text) > self.max_chars:
            return f"too long ({len(text)} > {self.max_chars} chars)"
        if not looks_like_text(text):
            return "not readable text"
        pii = find_pii(text, names, business)
        if pii:
            return "personal data: " + ", ".join(sorted(set(p.split(":")[0] for p in pii)))
        return ""

    def _embedding(self, text: str) -> list[float]:
        key = normalise(text)
        if key in self._emb_cache:
            self._emb_cache.move_to_end(key)
            return self._emb_cache[key]
        assert self.embedder is not None, "embedding requested without an embedder"
        vec = self._emb_cache[key] = self.embedder.embed([text])[0]
        while len(self._emb_cache) > self.embedding_cache_size:
            self._emb_cache.popitem(last=False)
        return vec

    subject_threshold: float = 0.6
    """Embedding cosine of two items' texts (or 0.8 of their questions) above which they are about the same
    subject; without an embedder, word-set Jaccard less the answer terms >= 0.4 (questions 0.5)."""

    def _cos(self, a: str, b: str) -> float:
        return sum(x * y for x, y in zip(self._embedding(a), self._embedding(b), strict=True))

    def same_subject(self, text: str, questions: Sequence[str], it: events_pb2.KnowledgeItem, *,
                     by_questions: bool = True) -> bool:
        """Two items speak about the same thing (whatever they say about it): by their texts, or (where
        `by_questions`) by the questions they answer."""
        if self.embedder is not None:
            if self._cos(text, it.text) >= self.subject_threshold:
                return True
            return by_questions and any(self._cos(q, r) >= 0.8 for q in questions[:3] for r in list(it.questions)[:3])
        terms = {w for t in (*answer_terms(text, questions), *it.answer_terms) for w in normalise(t).split()}
        a, b = word_set(text) - terms, word_set(it.text) - terms
        if a and b and len(a & b) / len(a | b) >= 0.4:
            return True
        return by_questions and any(jaccard(q, r) >= 0.5 for q in questions[:3] for r in list(it.questions)[:3])

    @staticmethod
    def _shared_term(terms: Sequence[str], other_terms: Sequence[str], other_text: str) -> bool:
        return any(term_in(t, other_text) for t in terms) or any(
            normalise(t) == normalise(o) for t in terms for o in other_terms)

    def same_fact(self, text: str, questions: Sequence[str], it: events_pb2.KnowledgeItem) -> bool:
        """Every answer term of `text` is the item's and the subject is the same; a shared code or number
        (RF-7734, 4410) needs only some words in common besides it (two facts rarely share a code and a
        topic)."""
        terms = answer_terms(text, questions)
        if not terms or not self._shared_term(terms, it.answer_terms, it.text):
            return False
        if not all(self._shared_term([t], it.answer_terms, it.text) for t in terms):
            return False        # it says more ("24 months, batteries 6 months"): new information, not a restatement
        if self.same_subject(text, questions, it):
            return True
        coded = [t for t in terms if any(ch.isdigit() for ch in t) and len(t) >= 3]
        if not coded or not self._shared_term(coded, it.answer_terms, it.text):
            return False
        words = {w for t in coded for w in normalise(t).split()}
        a, b = word_set(text) - words, word_set(it.text) - words
        return bool(a & b)

    def contradicts(self, new: events_pb2.KnowledgeItem, old: events_pb2.KnowledgeItem) -> bool:
        """`new` states something else than `old` about the same subject: both have answer terms, none shared."""
        if not new.answer_terms or not old.answer_terms or new.item_id == old.item_id:
            return False
        if self._shared_term(list(new.answer_terms), old.answer_terms, old.text) or \
                any(term_in(t, new.text) for t in old.answer_terms):
            return False
        # by the texts alone: questions are phrased alike across subjects ("How much is X?", "How much is Y?"),
        # and a false contradiction retires a good item
        return self.same_subject(new.text, (), old, by_questions=False)

    def duplicate_of(self, text: str, items: Sequence[events_pb2.KnowledgeItem],
                     questions: Sequence[str] = (), *, facts: bool = True) -> tuple[int, str] | None:
        """Index of the item `text` duplicates and how ("exact", "near", "embedding", "same_fact" where
        `facts`), else None. RETIRED items take no merges (a superseded fact restated is a new proposal)."""
        norm = normalise(text)
        terms = answer_terms(text, questions)

        def mergeable(it: events_pb2.KnowledgeItem) -> bool:
            # similar words but other values (18-month vs 24-month) are a contradiction, never a duplicate
            conflict = bool(terms) and bool(it.answer_terms) and not self._shared_term(terms, it.answer_terms, it.text)
            return it.status != S.ITEM_STATUS_RETIRED and not conflict

        best, best_sim = -1, 0.0
        for i, it in enumerate(items):
            if it.status == S.ITEM_STATUS_RETIRED:
                continue
            if normalise(it.text) == norm or it.item_id == item_id(text):
                return i, "exact"
            sim = jaccard(text, it.text)
            if sim > best_sim and mergeable(it):
                best, best_sim = i, sim
        if best >= 0 and best_sim >= self.near_threshold:
            return best, "near"
        if self.embedder is not None and items:
            v = self._embedding(text)
            sims = [sum(a * b for a, b in zip(v, self._embedding(it.text), strict=True)) if mergeable(it) else -1.0
                    for it in items]
            j = max(range(len(sims)), key=sims.__getitem__)
            if sims[j] >= self.embedding_threshold:
                return j, "embedding"
        for i, it in enumerate(items):
            if facts and it.status != S.ITEM_STATUS_RETIRED and self.same_fact(text, questions, it):
                return i, "same_fact"
        return None

    def over_cap(self, items: Sequence[events_pb2.KnowledgeItem], max_tokens: int) -> list[str]:
        """Ids of active items to evict so the active items fit in `max_tokens`.

        Order: 1) items with harmful - helpful >= harmful_margin, oldest first; 2) the oldest proposals
        (unreviewed, so a flood of proposals cannot push reviewed knowledge out); 3) the oldest approved.
        Pinned and rejected items never count and are never evicted here."""
        active = [it for it in items if it.status in ACTIVE]
        total = sum(it.token_count or self.count_tokens(it.text) for it in active)
        if total <= max_tokens:
            return []

        def age(it: events_pb2.KnowledgeItem) -> tuple[int, int]:
            return it.created_at.seconds, it.created_at.nanos

        harmful = sorted((it for it in active if it.harmful - it.helpful >= self.harmful_margin), key=age)
        rest = [it for it in active if it.harmful - it.helpful < self.harmful_margin]
        proposed = sorted((it for it in rest if it.status == S.ITEM_STATUS_PROPOSED), key=age)
        approved = sorted((it for it in rest if it.status != S.ITEM_STATUS_PROPOSED), key=age)
        evict: list[str] = []
        for it in [*harmful, *proposed, *approved]:
            if total <= max_tokens:
                break
            evict.append(it.item_id)
            total -= it.token_count or self.count_tokens(it.text)
        return evict
