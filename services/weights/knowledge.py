"""The knowledge topic --> each tenant's current knowledge items --> what the eval gate asks a candidate.

Approved knowledge serves in the prompt context until the weights hold it; the gate is where that is
decided, so the weights service keeps a view of every knowledge base, fed by the shared reader of the
compacted knowledge topic (shared/knowledge/follow.py: from the beginning on every start, nothing
committed, a snapshot whose key names another tenant than its envelope refused).

Checked items: status APPROVED, PINNED or CONSOLIDATED with at least one question and one answer term;
newest first (updated, else created), at most `knowledge_max_items` per gate run, each asked up to
QUESTIONS_PER_ITEM of its questions (the newest, as the extractor keeps them newest last).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from shared.knowledge.check_questions import split_questions
from shared.knowledge.follow import belongs_to_its_tenant, key_tenant
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)

CHECKED_STATUSES = frozenset({events_pb2.ITEM_STATUS_APPROVED, events_pb2.ITEM_STATUS_PINNED,
                              events_pb2.ITEM_STATUS_CONSOLIDATED})
"""Items that serve (or served until a promoted version held them): the ones whose fate the gate decides."""

QUESTIONS_PER_ITEM = 3
"""Questions asked per item: a paraphrase or two beyond the first shows the fact, not one phrasing, is held;
more would multiply the gate's generations for little."""


@dataclass(frozen=True)
class ItemCheck:
    """One item to ask the candidate about."""

    key: str                        # tenant/domain of its base
    item_id: str
    revision: int
    questions: tuple[str, ...]      # what to ask (at most QUESTIONS_PER_ITEM)
    answer_terms: tuple[str, ...]
    updated: float                  # seconds since the epoch (updated_at, else created_at): newest first

    @property
    def metric(self) -> str:
        """The EvalResult metric: one per item revision, so a rewritten item is a new check."""
        return f"item:{self.key}:{self.item_id}@{self.revision}"


def _questions(item: events_pb2.KnowledgeItem) -> tuple[str, ...]:
    """The item's check questions (shared/knowledge/check_questions.py: the ones consolidation never trains
    on, when it has enough to spare), newest first, at most QUESTIONS_PER_ITEM."""
    seen: dict[str, str] = {}
    _, check = split_questions(item.questions)
    for q in reversed(check):                             # newest last: take from the end
        text = " ".join(q.split())
        if text and text.lower() not in seen:
            seen[text.lower()] = text
        if len(seen) == QUESTIONS_PER_ITEM:
            break
    return tuple(seen.values())


def checks_of(snap: events_pb2.KnowledgeSnapshot, key: str) -> list[ItemCheck]:
    """The items of one base the gate can check (status, questions and answer terms present)."""
    out = []
    for it in snap.items:
        questions = _questions(it)
        terms = tuple(t for t in it.answer_terms if t.strip())
        if it.status not in CHECKED_STATUSES or not questions or not terms or not it.item_id:
            continue
        when = it.updated_at if it.HasField("updated_at") else it.created_at
        out.append(ItemCheck(key, it.item_id, int(it.revision), questions, terms,
                             when.seconds + when.nanos / 1e9))
    return out


class KnowledgeView:
    """The current snapshot per knowledge key, fed by `KnowledgeFollower` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, events_pb2.KnowledgeSnapshot] = {}
        self._ready = threading.Event()
        self.followed = False
        """True once a follower feeds this view; until then nobody waits for it to catch up."""
        self.ignored_other_tenant = 0

    def apply(self, snap: events_pb2.KnowledgeSnapshot) -> bool:
        """Take one snapshot record; True when it became its key's current base."""
        key = snap.key
        if not belongs_to_its_tenant(snap):
            self.ignored_other_tenant += 1
            return False
        with self._lock:
            current = self._snapshots.get(key)
            if current is not None and snap.version <= current.version:
                return False
            self._snapshots[key] = snap
            return True

    def forget(self, key: str) -> None:
        """A tombstone on the compacted topic: the base is gone."""
        with self._lock:
            self._snapshots.pop(key, None)

    def items_for(self, tenant: str, limit: int) -> list[ItemCheck]:
        """The tenant's checkable items over all its bases, newest first, at most `limit`."""
        if not tenant or limit <= 0:
            return []
        with self._lock:
            snaps = [(k, s) for k, s in self._snapshots.items() if key_tenant(k) == tenant]
        items = [c for k, s in snaps for c in checks_of(s, k)]
        items.sort(key=lambda c: (-c.updated, c.key, c.item_id))
        return items[:limit]

    def mark_ready(self) -> None:
        self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        """True once the follower read the topic to the end it had at start (or when nothing follows)."""
        return not self.followed or self._ready.wait(timeout)
