"""The knowledge topic --> each tenant's current knowledge items --> what the eval gate asks a candidate.

Approved knowledge serves in the prompt context until the weights hold it; the gate is where that is
decided, so the weights service keeps a view of every knowledge base: the compacted topic
`apprentice.knowledge.v1` (key "tenant/domain", value `KnowledgeSnapshot`, the highest `version` per key is
the base) read from its beginning on every start. It is state, not a stream of work: nothing is committed,
and each replica reads every partition (a consumer group of its own). A record whose key names another
tenant than its `envelope.tenant` is ignored (a producer may not write into another tenant's base).

Checked items: status APPROVED, PINNED or CONSOLIDATED with at least one question and one answer term;
newest first (updated, else created), at most `knowledge_max_items` per gate run, each asked up to
QUESTIONS_PER_ITEM of its questions (the newest, as the extractor keeps them newest last).
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

from shared.events import UndecodableEvent
from shared.proto.apprentice.v1 import events_pb2
from shared.validation import decode_record

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


def key_tenant(key: str) -> str:
    """The tenant part of a "tenant/domain" key ("" when the key has no domain part)."""
    tenant, sep, _ = key.partition("/")
    return tenant if sep else ""


def _questions(item: events_pb2.KnowledgeItem) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    for q in reversed(item.questions):                    # newest last: take from the end
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
        key = snap.key or f"{snap.envelope.tenant}/{snap.domain}"
        if not snap.envelope.tenant or key_tenant(key) != snap.envelope.tenant:
            self.ignored_other_tenant += 1
            log.warning("knowledge record ignored: key %r is not of its tenant %r", key[:200],
                        snap.envelope.tenant[:128])
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


class KnowledgeFollower:
    """Reads the knowledge topic from its beginning into a `KnowledgeView`, forever (a daemon thread's
    body): a consumer group of its own per start (every partition; nothing committed), and the view
    marked ready once the consumer's position reached the high watermarks seen at its assignment."""

    def __init__(self, view: KnowledgeView, bootstrap: str, topic: str, group_prefix: str) -> None:
        from shared.kafka import EventConsumer

        self.view = view
        self.topic = topic
        self.consumer = EventConsumer(bootstrap, f"{group_prefix}-{uuid.uuid4().hex[:12]}", [topic],
                                      auto_offset_reset="earliest")
        self._ends: dict[int, int] | None = None
        view.followed = True

    def poll(self, timeout: float = 0.5) -> int:
        """One poll: apply what arrived; returns the records read."""
        msgs = self.consumer.poll_batch(max_records=200, timeout=timeout)
        for msg in msgs:
            value = msg.value()
            if value is None:                            # tombstone: compaction deletes the key
                raw_key = msg.key()
                if raw_key:
                    self.view.forget(raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else raw_key)
                continue
            try:
                snap = decode_record(events_pb2.KnowledgeSnapshot, value, msg.headers())
            except UndecodableEvent as e:
                # re-read on every start, so a dead letter would repeat forever; the extractor owns the topic
                log.error("skipping undecodable knowledge record", extra={"offset": msg.offset(), "error": str(e)})
                continue
            self.view.apply(snap)
        if self._ends is None or not self.view.wait_ready(0):
            self._check_caught_up()
        return len(msgs)

    def _check_caught_up(self) -> None:
        from confluent_kafka import TopicPartition

        raw = self.consumer.raw
        assigned = [tp for tp in self.consumer.assignment() if tp.topic == self.topic]
        if not assigned:
            return                                        # the group has not assigned the partitions yet
        if self._ends is None:
            ends = {}
            for tp in assigned:
                low, high = raw.get_watermark_offsets(TopicPartition(self.topic, tp.partition), timeout=10)
                if high > low:
                    ends[tp.partition] = high
            self._ends = ends
        positions = raw.position([TopicPartition(self.topic, p) for p in self._ends]) if self._ends else []
        if all(tp.offset >= self._ends[tp.partition] for tp in positions):   # unfetched: OFFSET_INVALID < 0
            self.view.mark_ready()
            log.info("knowledge view caught up", extra={"topic": self.topic, "partitions": len(assigned)})

    def close(self) -> None:
        self.consumer.close()
