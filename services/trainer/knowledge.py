"""KnowledgeSnapshot records of one tenant --> the teacher's context for a prompt.

Only reviewed items (APPROVED, PINNED, CONSOLIDATED) may reach training (docs/architecture.md §6), whatever
the snapshot's `require_approval`. Items are data, never instructions: they enter the teacher's prompt in the
same frame that serving uses (shared/knowledge/frame.py). Keys are "<tenant>/<domain>", domain = the request's task tag ("general" if
empty). The last `keep` snapshots of a key are kept and one is sampled per example (the OEL recipe
trains on several knowledge snapshots); the teacher sees either all of its items or the few most
similar to the prompt (TF-IDF cosine; docs/oel-probe.md measured the relevant item to beat the whole base).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from services.trainer.rollouts import domain_of
from shared.knowledge.retrieval import tfidf_rank
from shared.proto.apprentice.v1 import events_pb2

# CONSOLIDATED items still teach: they left the serving context because the weights hold them, and
# consolidation keeps them held. RETIRED (superseded) and unreviewed items never train.
TRAINABLE = (events_pb2.ITEM_STATUS_APPROVED, events_pb2.ITEM_STATUS_PINNED, events_pb2.ITEM_STATUS_CONSOLIDATED)


@dataclass(frozen=True)
class Snapshot:
    key: str
    version: int
    items: tuple[str, ...]      # trainable item texts


class KnowledgeBase:
    def __init__(self, tenant: str, keep: int = 3) -> None:
        self.tenant = tenant
        self.keep = keep
        self.snapshots: dict[str, deque[Snapshot]] = {}
        self.skipped_other_tenant = 0

    def apply(self, snap: events_pb2.KnowledgeSnapshot) -> bool:
        """Take one snapshot record; True when it is a new version of this tenant with trainable items."""
        key = snap.key or f"{snap.envelope.tenant}/{domain_of(snap.domain)}"
        if snap.envelope.tenant != self.tenant or not key.startswith(self.tenant + "/"):
            self.skipped_other_tenant += 1
            return False
        hist = self.snapshots.setdefault(key, deque(maxlen=self.keep))
        if hist and snap.version <= hist[-1].version:
            return False
        items = tuple(i.text for i in snap.items if i.status in TRAINABLE and i.text.strip())
        hist.append(Snapshot(key, snap.version, items))
        return bool(items)

    def key_for(self, task: str) -> str:
        return f"{self.tenant}/{domain_of(task)}"

    def versions(self) -> dict[str, int]:
        """Latest version per key that has trainable items (recorded with each consolidated version)."""
        return {k: h[-1].version for k, h in self.snapshots.items() if h and h[-1].items}

    def has_items(self, task: str) -> bool:
        return any(s.items for s in self.snapshots.get(self.key_for(task)) or ())

    def context(self, query: str, task: str, rng: random.Random, *, retrieval: str = "tfidf",
                n_items: int = 3) -> list[str]:
        """Items for the teacher's context: a snapshot sampled among the recent ones of the prompt's
        domain, then all its items (retrieval="all") or the n most similar to `query` ("tfidf")."""
        hist = [s for s in self.snapshots.get(self.key_for(task)) or () if s.items]
        if not hist:
            return []
        items = list(rng.choice(hist).items)
        if retrieval == "all" or len(items) <= n_items:
            return items
        if retrieval != "tfidf":
            raise ValueError(f"unknown retrieval {retrieval!r} (use 'all' or 'tfidf')")
        order = tfidf_rank(query, items)[:n_items]
        return [items[i] for i in sorted(order)]      # keep the base's order in the prompt
