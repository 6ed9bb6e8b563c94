"""Consumed records (sources and join bundles) + timer ticks --> one batch's outputs (pure: no Kafka).

The native runtime's whole per-record path. A source record is routed (routing.py); its join item is
applied at once when this worker owns the item's join partition (the "local shortcut": with one worker,
every item), or else travels to the owner through the join topic, bundled per partition. Join items
(local, or from join-topic bundles) and due ticks go through the same state machine as under faust
(`Joiner`), against this worker's `StateStore`.

The outputs are what one Kafka transaction then writes: each changed state once (its latest version),
graded records, dead letters, join bundles for other workers, judge items. The store already holds the
new states; if the transaction fails, the caller reloads the store from the changelog.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from services.grader import metrics as M
from services.grader.bundles import BadJoinRecord, decode_bundle, partition_for
from services.grader.join import TICK, Joiner, Rejected, letter_value
from services.grader.limits import oversize
from services.grader.routing import dead_letter, route
from services.grader.state import SEQ_KEY_PREFIX, PendingState
from services.grader.store import StateStore
from shared.proto.apprentice.v1 import events_pb2
from shared.validation import HeadersLike

log = logging.getLogger(__name__)

SOURCE = "grader"
TICK_RETRY_S = 30.0
"""A due tick that changed nothing is tried again after this long, not on every timer round."""


class Record(Protocol):
    """What the batch reads of a consumed record (confluent_kafka.Message has these methods)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> HeadersLike: ...


@dataclass
class Outputs:
    states: dict[str, tuple[int, PendingState | None]] = field(default_factory=dict)
    """Changelog writes: interaction id -> (partition, latest state or None = delete)."""
    blobs: dict[str, bytes] = field(default_factory=dict)
    """interaction id -> its latest state, encoded (encoded once, to check its size before it is kept)."""
    graded: list[events_pb2.GradedInteraction] = field(default_factory=list)
    dead: list[tuple[bytes | None, events_pb2.DeadLetter]] = field(default_factory=list)
    """(original key, letter) for the dead-letter topic."""
    hops: dict[int, list[tuple[bytes, bytes]]] = field(default_factory=lambda: defaultdict(list))
    """Join items for partitions another worker owns: join partition -> items (one bundle each)."""
    judge: list[tuple[bytes, bytes]] = field(default_factory=list)
    """(group id, item) for the judge stage."""
    events: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(item kind, outcome) -> count, for the events metric once the batch committed."""

    def __bool__(self) -> bool:
        return bool(self.states or self.graded or self.dead or self.hops or self.judge)


class BatchGrader:
    def __init__(self, joiner: Joiner, store: StateStore, *, interactions_topic: str, join_topic: str,
                 partitions: int) -> None:
        self.joiner = joiner
        self.store = store
        self.interactions_topic = interactions_topic
        self.join_topic = join_topic
        self.partitions = partitions

    def add(self, rec: Record, out: Outputs, now: float) -> None:
        """Apply one consumed record: a join bundle of a partition this worker owns, or a source record."""
        topic = rec.topic()
        if topic == self.join_topic:
            p = rec.partition() or 0
            try:
                items = decode_bundle(rec.value())
            except BadJoinRecord as e:
                self._reject(Rejected("grader.join", str(e), type(e).__name__), rec, out, rec.key(), rec.value())
                return
            for key, value in items:
                self._apply(p, key, value, now, out, rec)
            return
        r = route(topic == self.interactions_topic, rec.value(), self.joiner.task_of, rec.headers(),
                  limits=self.joiner.limits, now=now)
        if r.rejected is not None:
            self._reject(r.rejected, rec, out, rec.key(), rec.value())
            return
        if r.judge is not None:
            out.judge.append(r.judge)
        if r.join is not None:
            key, value = r.join
            p = partition_for(key, self.partitions)
            if self.store.owns(p):
                self._apply(p, key, value, now, out, rec, r.interaction)
            else:
                out.hops[p].append((key, value))

    def tick(self, out: Outputs, now: float) -> None:
        """Windows that ended, retention that ran out, orphan feedback that expired."""
        for p, key in self.store.pop_due(now):
            self._apply(p, key.encode(), TICK, now, out, None)

    def _apply(self, p: int, key: bytes, value: bytes, now: float, out: Outputs, rec: Record | None,
               parsed: events_pb2.Interaction | None = None) -> None:
        k = key.decode(errors="replace")
        if k.startswith(SEQ_KEY_PREFIX):  # faust's confirmation keys are not interaction ids
            self._reject(Rejected("grader.join", f"reserved key {k!r}", "BadJoinRecord"), rec, out, key, value)
            return
        current = self.store.get(p, k)
        step = self.joiner.apply_guarded(current.copy() if current is not None else None, key, value, now, p,
                                         parsed)
        blob = b""
        if not isinstance(step, Rejected):
            if step.changed and step.state is not None:
                blob = step.state.encode()
            too_big = oversize(len(blob), step.emit, self.joiner.limits)
            if too_big is not None:
                step = Rejected(too_big.stage, too_big.reason, "Refused")
        if isinstance(step, Rejected):
            self._reject(step, rec, out, key, letter_value(step, value))
            if current is not None and value[:1] == TICK:
                self.store.put(p, k, current, not_before=now + TICK_RETRY_S)
            return
        for body, why in step.refused:
            self._reject(why, None, out, key, body)
        out.events[(value[:1].decode(errors="replace"), step.note or ("emitted" if step.emit else "applied"))] += 1
        if step.changed:
            self.store.put(p, k, step.state)
            out.states[k] = (p, step.state)
            if step.state is not None:
                out.blobs[k] = blob
            else:
                out.blobs.pop(k, None)
        elif current is not None and value[:1] == TICK:
            self.store.put(p, k, current, not_before=now + TICK_RETRY_S)  # re-index the popped tick
        if step.emit is not None:
            out.graded.append(step.emit)

    def _reject(self, rejected: Rejected, rec: Record | None, out: Outputs, key: bytes | None,
                value: bytes | None) -> None:
        topic, partition, offset = ((rec.topic() or "", rec.partition() or 0, rec.offset() or 0) if rec is not None
                                    else (self.join_topic, -1, -1))
        out.dead.append((key, dead_letter(rejected, source=SOURCE, topic=topic, partition=partition,
                                          offset=offset, key=key, value=value)))
        M.DEADLETTERS.labels(rejected.stage).inc()
        log.warning("dead-lettered record", extra={"stage": rejected.stage, "reason": rejected.reason[:300],
                                                    "origin": f"{topic}/{partition}@{offset}"})
