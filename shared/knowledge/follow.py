"""The compacted knowledge topic --> every base's newest snapshot, for the services that read knowledge as
state (inference serves it in context, the weights gate checks it): one reader, one tenant rule.

The topic (key "tenant/domain", value `KnowledgeSnapshot`, the highest `version` per key is the base) is
read from its beginning on every start, by a consumer group of its own (every partition; nothing is
committed: it is state, not a stream of work). A snapshot whose key names another tenant than its
envelope must be refused by the receiver (`belongs_to_its_tenant`, which every receiver applies): a
producer may not place items in another tenant's base. A tombstone (no value) removes its base. `caught_up` is set once the reader's position reached the high
watermarks seen at its assignment, so a service can wait for the state it had before serving.
Undecodable records are logged and skipped, not dead-lettered: every replica re-reads them on every start.

With a `trust` (a factory of shared/kafka/trust.py's RecordTrust, `monotonic=True`) every record, tombstones included, must be signed
by a principal allowed to write the knowledge topic (the extractor) and not be an old snapshot replayed
after a newer one of its key; a refused record is handed to `on_refused` (the service dead-letters it with
the reason) and never reaches `on_snapshot` / `on_tombstone`, so a forged snapshot is never served.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import TopicPartition

from shared.contracts.events import UndecodableEvent
from shared.contracts.validation import decode_record
from shared.kafka.consumer import EventConsumer
from shared.kafka.reader import watermarks
from shared.kafka.trust import RecordTrust, UntrustedRecord
from shared.proto.apprentice.v1 import events_pb2
from shared.retry import Backoff

log = logging.getLogger(__name__)


def key_tenant(key: str) -> str:
    """The tenant part of a "tenant/domain" key ("" when the key has no domain part)."""
    tenant, sep, domain = key.partition("/")
    return tenant if sep and domain else ""


def belongs_to_its_tenant(snap: events_pb2.KnowledgeSnapshot) -> bool:
    """The snapshot's key names the tenant its envelope carries (and both are set)."""
    return bool(snap.envelope.tenant) and key_tenant(snap.key) == snap.envelope.tenant


class SnapshotFollower:
    """Reads the knowledge topic into `on_snapshot` / `on_tombstone` on a daemon thread (see the module
    docstring); a broker error closes the consumer and starts reading again, from the beginning."""

    def __init__(self, bootstrap: str, topic: str, group_prefix: str, *,
                 on_snapshot: Callable[[events_pb2.KnowledgeSnapshot], object],
                 on_tombstone: Callable[[str], object] = lambda key: None, name: str = "knowledge",
                 trust: Callable[[], RecordTrust] | None = None,
                 on_refused: Callable[[object, UntrustedRecord], object] | None = None) -> None:
        self.bootstrap, self.topic, self.group_prefix = bootstrap, topic, group_prefix
        self.on_snapshot, self.on_tombstone = on_snapshot, on_tombstone
        # a fresh check per reading from the beginning: the monotonic memory of the last pass would refuse
        # every older snapshot of a key read again
        self._new_trust, self.on_refused = trust, on_refused
        self.trust: RecordTrust | None = trust() if trust is not None else None
        self.caught_up = threading.Event()
        self._ends: dict[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> SnapshotFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        backoff = Backoff(1.0, 5.0)
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = EventConsumer(self.bootstrap, f"{self.group_prefix}-{uuid.uuid4().hex[:12]}",
                                         [self.topic], auto_offset_reset="earliest", log_level=3)
                self._ends = None
                if self._new_trust is not None:
                    self.trust = self._new_trust()
                while not self._stop.is_set():
                    self.poll(consumer)
                    backoff.reset()
            except Exception:  # noqa: BLE001 - the broker may come back; the state is rebuilt by reading again
                log.exception("knowledge follower error; reading again")
                self._stop.wait(backoff.next())
            finally:
                if consumer is not None:
                    consumer.close()

    def poll(self, consumer: object, timeout: float = 0.5) -> int:
        """One poll: hand over what arrived; returns the records read."""
        msgs = consumer.poll_batch(max_records=200, timeout=timeout)  # type: ignore[attr-defined]
        for msg in msgs:
            if self.trust is not None:
                try:
                    self.trust.check(msg)
                except UntrustedRecord as e:
                    log.error("knowledge record refused: %s", e,
                              extra={"partition": msg.partition(), "offset": msg.offset()})
                    if self.on_refused is not None:
                        try:
                            self.on_refused(msg, e)
                        except Exception:  # noqa: BLE001 - a failed dead letter must not stop the state
                            log.exception("dead-lettering a refused knowledge record failed")
                    continue
            value = msg.value()
            if value is None:                                   # tombstone: compaction deletes the key
                raw = msg.key()
                if raw:
                    self.on_tombstone(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
                continue
            try:
                snap = decode_record(events_pb2.KnowledgeSnapshot, value, msg.headers())
            except UndecodableEvent as e:
                log.error("skipping undecodable knowledge record", extra={"offset": msg.offset(), "error": str(e)})
                continue
            if not belongs_to_its_tenant(snap):
                log.warning("knowledge snapshot refused: key %r is not of its tenant %r", snap.key[:200],
                            snap.envelope.tenant[:128])
            self.on_snapshot(snap)      # the receiver applies the same rule (and counts what it refused)
        if not self.caught_up.is_set():
            self._check_caught_up(consumer)
        return len(msgs)

    def _check_caught_up(self, consumer: object) -> None:
        assigned = [tp for tp in consumer.assignment() if tp.topic == self.topic]  # type: ignore[attr-defined]
        if not assigned:
            return                                              # the group has not assigned the partitions yet
        raw = consumer.raw  # type: ignore[attr-defined]
        if self._ends is None:
            ends = {}
            for tp in assigned:
                low, high = watermarks(raw, self.topic, tp.partition, time.monotonic() + 10)
                if high > low:
                    ends[tp.partition] = high
            self._ends = ends
        positions = raw.position([TopicPartition(self.topic, p) for p in self._ends]) if self._ends else []
        if all(tp.offset >= self._ends[tp.partition] for tp in positions):   # unfetched: OFFSET_INVALID < 0
            self.caught_up.set()
            log.info("knowledge caught up", extra={"topic": self.topic, "partitions": len(assigned)})
