"""KnowledgeSnapshot records of one tenant --> the teacher's context for a prompt.

Only reviewed items (APPROVED, PINNED, CONSOLIDATED) may reach training (docs/architecture.md §6), whatever
the snapshot's `require_approval`. Items are data, never instructions: they enter the teacher's prompt in the
same frame that serving uses (shared/knowledge/frame.py). Keys are "<tenant>/<domain>", domain = the request's task tag ("general" if
empty). The last `keep` snapshots of a key are kept and one is sampled per example (the OEL recipe
trains on several knowledge snapshots); the teacher sees what a serving pod would add to that prompt (the
same retriever, threshold and margin: the relevant item, rarely more; docs/oel-probe.md measured the
relevant item alone to beat it with distractors, 11/20 vs 6/20), or the whole base, or the TF-IDF top n.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from services.trainer.rollouts import domain_of
from shared.knowledge.embeddings import EmbeddingsUnavailable, MiniLMEmbedder
from shared.knowledge.retrieval import Entry, Retriever, tfidf_rank
from shared.proto.apprentice.v1 import events_pb2

# CONSOLIDATED items still teach: they left the serving context because the weights hold them, and
# consolidation keeps them held. RETIRED (superseded) and unreviewed items never train.
TRAINABLE = (events_pb2.ITEM_STATUS_APPROVED, events_pb2.ITEM_STATUS_PINNED, events_pb2.ITEM_STATUS_CONSOLIDATED)


@dataclass(frozen=True)
class Snapshot:
    key: str
    version: int
    items: tuple[str, ...]      # trainable item texts
    entries: tuple[Entry, ...] = ()   # the same items with their questions, for the serving retriever


class KnowledgeBase:
    def __init__(self, tenant: str, keep: int = 3) -> None:
        self.tenant = tenant
        self.keep = keep
        self.snapshots: dict[str, deque[Snapshot]] = {}
        self.skipped_other_tenant = 0
        self._retriever: Retriever | None = None

    def apply(self, snap: events_pb2.KnowledgeSnapshot) -> bool:
        """Take one snapshot record; True when it is a new version of this tenant with trainable items."""
        key = snap.key or f"{snap.envelope.tenant}/{domain_of(snap.domain)}"
        if snap.envelope.tenant != self.tenant or not key.startswith(self.tenant + "/"):
            self.skipped_other_tenant += 1
            return False
        hist = self.snapshots.setdefault(key, deque(maxlen=self.keep))
        if hist and snap.version <= hist[-1].version:
            return False
        kept = [i for i in snap.items if i.status in TRAINABLE and i.text.strip()]
        entries = tuple(Entry(key=key, item_id=i.item_id, revision=i.revision, snapshot_version=snap.version,
                              text=i.text, questions=tuple(i.questions), tokens=i.token_count) for i in kept)
        hist.append(Snapshot(key, snap.version, tuple(i.text for i in kept), entries))
        return bool(kept)

    def key_for(self, task: str) -> str:
        return f"{self.tenant}/{domain_of(task)}"

    def versions(self) -> dict[str, int]:
        """Latest version per key that has trainable items (recorded with each consolidated version)."""
        return {k: h[-1].version for k, h in self.snapshots.items() if h and h[-1].items}

    def has_items(self, task: str) -> bool:
        return any(s.items for s in self.snapshots.get(self.key_for(task)) or ())

    def context(self, query: str, task: str, rng: random.Random, *, retrieval: str = "serving",
                n_items: int = 3) -> list[str]:
        """Items for the teacher's context: a snapshot sampled among the recent ones of the prompt's
        domain, then all its items (retrieval="all"), the n most similar to `query` ("tfidf"), or what the
        serving pods would put in this prompt's context ("serving": the same retriever, threshold and
        margin, shared/knowledge/retrieval.py; nothing when no item is relevant)."""
        hist = [s for s in self.snapshots.get(self.key_for(task)) or () if s.items]
        if not hist:
            return []
        snap = rng.choice(hist)
        items = list(snap.items)
        if retrieval == "serving":
            chosen = self.retriever().select(query, list(snap.entries), max_items=n_items, max_tokens=1 << 20)
            order = {e.item_id: i for i, e in enumerate(snap.entries)}
            return [e.text for e, _ in sorted(chosen, key=lambda p: order[p[0].item_id])]   # the base's order
        if retrieval == "all" or len(items) <= n_items:
            return items
        if retrieval != "tfidf":
            raise ValueError(f"unknown retrieval {retrieval!r} (use 'serving', 'all' or 'tfidf')")
        order_ = tfidf_rank(query, items)[:n_items]
        return [items[i] for i in sorted(order_)]      # keep the base's order in the prompt

    def retriever(self) -> Retriever:
        """The serving pods' retriever (the shipped sentence embedder, else TF-IDF), built on first use."""
        if self._retriever is None:
            try:
                self._retriever = Retriever(MiniLMEmbedder())
            except EmbeddingsUnavailable:
                self._retriever = Retriever(None)
        return self._retriever
