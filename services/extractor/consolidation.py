"""Promotion orders + the promoted version's gate results --> knowledge items leave or rejoin the context.

The eval gate asks each reviewed item's questions of every candidate without the item in context and
records, per item, whether the candidate answered them (`EvalResult` suite "knowledge", metric
"item:<tenant/domain>:<item id>@<revision>", passed = held; services/weights/README.md). When a version is
promoted (or rolled back to) for a tenant, the extractor, which owns the knowledge topic, reads those
results from the version's manifest and moves items: APPROVED and held --> CONSOLIDATED (no longer served
in context: the weights hold it), CONSOLIDATED and not held, or not checked --> APPROVED again. Only the
result for the item's current revision counts: an item edited since the check was not checked.

Orders are read with a consumer group of their own and committed after the new snapshots are durable, so
one replica applies each order once; re-applying one is harmless (the same results give the same states).
"""

from __future__ import annotations

import logging
import threading

from services.extractor.knowledge import KnowledgeStore
from shared.contracts.events import UndecodableEvent
from shared.kafka.consumer import EventConsumer
from shared.kafka.deadletter import DeadLetterPublisher
from shared.kafka.trust import RecordTrust
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.retry import Backoff

log = logging.getLogger(__name__)

SUITE = "knowledge"
APPLIES = (events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_ROLLBACK)


def item_metric(key: str, item_id: str, revision: int) -> str:
    """The gate's metric name for one item's check."""
    return f"item:{key}:{item_id}@{revision}"


def parse_item_metric(metric: str) -> tuple[str, str, int] | None:
    """(key, item id, revision) of an item check's metric, None for any other metric."""
    if not metric.startswith("item:"):
        return None
    head, _, rev = metric[5:].rpartition("@")
    key, _, item = head.rpartition(":")
    if not key or not item or not rev.isdigit():
        return None
    return key, item, int(rev)


def held_items(m: weights_pb2.Manifest) -> dict[tuple[str, str], tuple[int, bool]]:
    """The manifest's per-item checks: (key, item id) --> (revision checked, held)."""
    out: dict[tuple[str, str], tuple[int, bool]] = {}
    for r in m.eval_results:
        parsed = parse_item_metric(r.metric) if r.suite == SUITE else None
        if parsed is not None:
            key, item, rev = parsed
            out[(key, item)] = (rev, r.passed)
    return out


class ConsolidationFollower:
    """model-updates --> Weights.Get(version) --> KnowledgeStore.consolidate, on a background thread."""

    def __init__(self, store: KnowledgeStore, bootstrap: str, topic: str, group: str, weights_stub: object, *,
                 trust: RecordTrust | None = None, deadletters: DeadLetterPublisher | None = None) -> None:
        """`trust`: the check of each order (only the weights service may write model updates, and an
        order signed well before the last one applied is an old order replayed: shared/kafka/trust.py);
        None accepts every order (signatures off). `deadletters`: where refused orders go, with why."""
        self.store, self.bootstrap, self.topic, self.group = store, bootstrap, topic, group
        self.stub = weights_stub
        self.trust = trust or RecordTrust(None, monotonic=True)
        self.deadletters = deadletters
        self.refused = 0
        self.applied = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="extractor-consolidation", daemon=True)

    def start(self) -> ConsolidationFollower:
        self._thread.start()
        return self

    def apply(self, u: events_pb2.ModelUpdate) -> int:
        """One order; returns how many snapshots changed. Raises on a weights error (the order is retried)."""
        if u.action not in APPLIES or not u.version:
            return 0
        m = self.stub.Get(weights_pb2.GetVersionRequest(model=u.model, version=u.version),  # type: ignore[attr-defined]
                          timeout=30)
        held = held_items(m)
        tenants = [u.tenant] if u.tenant else sorted({k.split("/", 1)[0] for k in self.store.base_keys()})
        changed = sum(len(self.store.consolidate(t, u.version, held)) for t in tenants)
        self.applied += 1
        if changed:
            log.info("knowledge consolidation applied", extra={"version": u.version, "tenant": u.tenant,
                                                                "snapshots": changed})
        return changed

    def _run(self) -> None:
        consumer = EventConsumer(self.bootstrap, self.group, [self.topic], log_level=3)
        backoff = Backoff(1.0, 10.0)
        try:
            while not self._stop.is_set():
                try:
                    msgs = consumer.poll_batch(max_records=50, timeout=0.5)
                    for msg in msgs:
                        try:
                            u = self.trust.decode(events_pb2.ModelUpdate, msg)
                        except UndecodableEvent as e:
                            self.refused += 1
                            if self.deadletters is not None:
                                self.deadletters.publish(msg, stage="extractor.consolidation", reason=str(e),
                                                         error_type=type(e).__name__)
                            else:
                                log.error("refused model update skipped: %s", e)
                            continue
                        self.apply(u)
                    if msgs:
                        consumer.commit(msgs)
                    backoff.reset()
                except Exception:  # noqa: BLE001 - retried: uncommitted orders are read again
                    log.exception("knowledge consolidation failed; retrying")
                    consumer.close()
                    self._stop.wait(backoff.next())
                    consumer = EventConsumer(self.bootstrap, self.group, [self.topic], log_level=3)
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
