"""The model registry the weights service's gRPC servicer (servicer.py) works on: the store, the order desk,
the promotion policy, the pod registry, and the background threads that feed them (the checkpoints consumer,
the knowledge follower, GC, the pods watchdog). The process's handle around it is service.py.

    CheckpointPublished --> eval gate --> policy;  Promote/Canary/Rollback --> ModelUpdate on model-updates;
    PodHeartbeat --> Status, canary review;  KnowledgeSnapshot --> the gate's view of approved items.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from services.weights import audit_trail
from services.weights.audit_trail import Trail
from services.weights.blob_backends import make_blob_store
from services.weights.evaluator import Evaluator
from services.weights.knowledge import KnowledgeView
from services.weights.metrics import ORDERS, PODS
from services.weights.orders import OrderDesk
from services.weights.pod_share import PodShare
from services.weights.pods import PodRegistry
from services.weights.policy import PromotionPolicy
from services.weights.quotas import UploadLimits, UploadQuotas
from services.weights.settings import WeightsSettings
from services.weights.store import WeightStore
from shared.audit import AuditLog
from shared.contracts.events import UndecodableEvent
from shared.contracts.topic_access import WEIGHTS
from shared.contracts.validation import decode_record
from shared.kafka import DeadLetterPublisher, DeliveryError, EventConsumer, EventProducer
from shared.kafka.signing import RecordSigner
from shared.kafka.trust import RecordTrust, UntrustedRecord, record_signer
from shared.knowledge.follow import SnapshotFollower
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.retry import Backoff, call
from shared.rpc.grpc_util import FailedPrecondition, InvalidRequest, NotFound, Unavailable
from shared.security.identity import acting_as

log = logging.getLogger(__name__)


@dataclass
class WeightsService:
    """Everything the servicer needs, and the background threads (checkpoints, GC, watchdog)."""

    settings: WeightsSettings
    store: WeightStore = field(init=False)
    pods: PodRegistry = field(init=False)
    desk: OrderDesk = field(init=False)
    policy: PromotionPolicy = field(init=False)
    evaluator: Evaluator | None = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.topics = s.common.topics
        self.store = WeightStore(make_blob_store(s.store.kind, s.store_root), s.store_root)
        replica = s.replica_id or f"{socket.gethostname()}-{s.port or os.getpid()}"
        self.pods = PodRegistry(max_pods_per_identity=s.max_pods_per_identity, max_pods=s.max_pods,
                                forget_s=s.pod_forget_s, share=PodShare(s.store_root / "pods", replica))
        self.quotas = UploadQuotas(UploadLimits(
            max_upload_bytes=s.max_upload_bytes, max_uploads_per_identity=s.max_uploads_per_identity,
            max_bytes_per_identity=s.max_upload_bytes_per_identity, max_bytes_total=s.max_upload_bytes_in_flight))
        # Model updates, audit records and dead letters all carry the weights principal's signature; the key
        # is loaded once, when the service starts (start_background) or first produces: a missing private key
        # (signatures required) stops the start with SigningKeyMissing. Building the service loads nothing.
        self._signer: RecordSigner | None = None
        self._signer_loaded = False
        self._producer: EventProducer | None = None
        self._producer_lock = threading.Lock()
        self._audit_log: AuditLog | None = None
        # fed by the knowledge follower thread (started with the consumers); without it the gate has no items
        self.knowledge: KnowledgeView | None = KnowledgeView() if s.knowledge_max_items > 0 else None
        self.evaluator = Evaluator(self.store, s, knowledge=self.knowledge)
        self.desk = OrderDesk(self.store, self._publish, source="weights", weights_endpoint=s.advertised_endpoint,
                              gate=self._gate, integrity=self.evaluator.check_integrity,
                              audit=Trail(self._audit_record))
        self.policy = PromotionPolicy(self.store, self.desk, self.evaluator, s)
        self._stop = threading.Event()
        self._gc_wanted = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lagging_logged: set[tuple[str, str, str]] = set()
        self._trust = RecordTrust.from_settings(s.common)   # replaced by the consumer's own when it starts
        self._review_lock = threading.Lock()  # pods beat concurrently: one canary verdict at a time

    # --- effects ---------------------------------------------------------------------------------------
    @property
    def producer(self) -> EventProducer:
        """Created on first use: a store that only serves bytes (benchmarks, tests) needs no broker."""
        with self._producer_lock:
            if self._producer is None:
                self._producer = EventProducer(self.settings.common.kafka_bootstrap, client_id="weights",
                                               signer=self._load_signer())
            return self._producer

    def _audit_record(self, *args: Any, **kwargs: Any) -> events_pb2.AuditRecord:
        """`AuditLog.record` on the service's producer (both created on first use)."""
        if self._audit_log is None:
            producer = self.producer  # takes the lock itself
            with self._producer_lock:
                if self._audit_log is None:
                    self._audit_log = AuditLog(producer, self.topics, source="weights")
        return self._audit_log.record(*args, **kwargs)

    def _publish(self, update: events_pb2.ModelUpdate) -> None:
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        self.producer.produce(self.topics.model_updates, update.model, update, on_delivery=delivered)
        try:
            self.producer.flush(10.0)
        except DeliveryError as e:
            raise Unavailable(f"order not confirmed by Kafka ({e}); nothing changed, retry") from e
        if errors:
            raise Unavailable(f"order not delivered to Kafka: {errors[0]}; nothing changed, retry")
        ORDERS.labels({1: "promote", 2: "canary", 3: "rollback"}.get(update.action, "unknown")).inc()

    def _gate(self, m: weights_pb2.Manifest) -> weights_pb2.Manifest:
        assert self.evaluator is not None
        return self.evaluator.evaluate(m)   # timed and counted there

    def status(self, model: str) -> weights_pb2.StatusResponse:
        s = self.settings
        state = self.store.state(model)
        resp = self.pods.status(state, order_deadline_s=s.order_deadline_s, heartbeat_timeout_s=s.heartbeat_timeout_s,
                                forget_s=s.pod_forget_s)
        resp.canary_healthy_requests = sum(
            self.pods.canary_health(model, slot.canary, heartbeat_timeout_s=s.heartbeat_timeout_s)[0]
            for slot in state.slots.values() if slot.canary)
        return resp

    def review_canaries(self, model: str) -> None:
        s = self.settings
        try:
            with self._review_lock:
                self.desk.review_canaries(model, self.pods, min_requests=s.canary_min_requests,
                                          auto_promote=s.policy == "canary",
                                          heartbeat_timeout_s=s.heartbeat_timeout_s,
                                          rollback_min_requests=s.canary_rollback_min_requests,
                                          max_error_rate=s.canary_max_error_rate)
        except Unavailable as e:
            log.error("canary review could not send its order: %s", e)

    def request_gc(self) -> None:
        self._gc_wanted.set()

    # --- background threads ----------------------------------------------------------------------------
    def _load_signer(self) -> RecordSigner | None:
        if not self._signer_loaded:
            self._signer = record_signer(self.settings.common, WEIGHTS)
            self._signer_loaded = True
        return self._signer

    def start_background(self, consume: bool = True) -> None:
        self._load_signer()    # before any thread: a missing key stops the start
        targets = [self._gc_loop, self._watchdog_loop, self._pod_share_loop]
        targets += [self._consume_loop] if consume else []
        if consume and self.knowledge is not None:
            targets.append(self._knowledge_loop)
            self.knowledge.followed = True  # before any gate runs: it waits for the view to catch up
        for target in targets:
            t = threading.Thread(target=target, name=f"weights-{target.__name__.strip('_')}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._gc_wanted.set()
        for t in self._threads:
            t.join(timeout=30)
        if self._producer is not None:
            self._producer.close()

    def _gc_loop(self) -> None:
        while not self._stop.is_set():
            self._gc_wanted.wait(self.settings.gc_interval_s)
            self._gc_wanted.clear()
            if self._stop.is_set():
                return
            try:
                self.store.collect(self.settings.keep_last, also_keep=self.settings.reference_versions())
            except Exception:  # noqa: BLE001 - retention must never take the service down
                log.exception("garbage collection failed")

    def _watchdog_loop(self) -> None:
        """Make stale pods loud: an error log per lagging pod and order, and the pods gauge."""
        while not self._stop.wait(min(5.0, self.settings.order_deadline_s / 2)):
            try:
                for model in self.store.manifests.models():
                    st = self.status(model)
                    for label, n in (("converged", sum(p.converged for p in st.pods)), ("lagging", st.lagging_pods),
                                     ("total", len(st.pods))):
                        PODS.labels(model, label).set(n)
                    for p in st.pods:
                        key = (model, p.pod_id, st.last_order_id)
                        if p.lagging and key not in self._lagging_logged:
                            self._lagging_logged.add(key)
                            log.error("pod did not follow the last order within the deadline",
                                      extra={"model": model, "pod": p.pod_id, "detail": p.detail})
            except Exception:  # noqa: BLE001
                log.exception("watchdog failed")

    def _pod_share_loop(self) -> None:
        """Write the heartbeats this replica received for the other replicas over the store (pod_share.py)."""
        while not self._stop.wait(self.settings.pod_share_interval_s):
            try:
                self.pods.publish()
            except OSError:
                log.exception("could not share pod heartbeats with the other weights replicas")

    def _knowledge_loop(self) -> None:
        """Follow the knowledge topic into the gate's view (shared/knowledge/follow.py) until the service stops."""
        assert self.knowledge is not None
        view, s = self.knowledge, self.settings
        dead = DeadLetterPublisher(self.producer, self.topics.deadletter, source="weights")

        def refused(msg: Any, err: UntrustedRecord) -> None:
            # the gate never checks a model against knowledge the extractor did not write
            dead.publish(msg, stage="weights.knowledge", reason=str(err), error_type=type(err).__name__)

        follower = SnapshotFollower(s.common.kafka_bootstrap, self.topics.knowledge,
                                    self.topics.group_id(s.consumer_group + "-knowledge"),
                                    on_snapshot=view.apply, on_tombstone=view.forget, name="weights-knowledge",
                                    trust=lambda: RecordTrust.from_settings(s.common, monotonic=True),
                                    on_refused=refused).start()
        try:
            while not self._stop.is_set():
                if follower.caught_up.wait(0.5):
                    view.mark_ready()
                    self._stop.wait()
        finally:
            follower.stop()

    def _consume_loop(self) -> None:
        s = self.settings
        consumer = EventConsumer(s.common.kafka_bootstrap, self.topics.group_id(s.consumer_group),
                                 [self.topics.checkpoints])
        dead = DeadLetterPublisher(self.producer, self.topics.deadletter, source="weights")
        self._trust = RecordTrust.from_settings(s.common)   # checkpoints only from the trainer (topic_access.py)
        backoff = Backoff(1.0, 5.0)
        try:
            while not self._stop.is_set():
                try:
                    msgs = consumer.poll_batch(max_records=10, timeout=0.5)
                    for msg in msgs:
                        with acting_as(audit_trail.SELF):  # the policy's orders are the service's own
                            self._handle_record(msg, dead)
                        if self._stop.is_set():
                            return  # uncommitted: redelivered to the next owner
                    consumer.commit(msgs)
                    backoff.reset()
                except Exception:  # noqa: BLE001 - the broker may come back; handlers are idempotent
                    log.exception("checkpoints consumer error; retrying")
                    self._stop.wait(backoff.next())
        finally:
            consumer.close()

    def _handle_record(self, msg: Any, dead: DeadLetterPublisher) -> None:
        try:
            # who wrote it first (UntrustedRecord is an UndecodableEvent): a checkpoint not signed by the
            # trainer is never registered, evaluated or promoted
            self._trust.check(msg)
            ev = decode_record(events_pb2.CheckpointPublished, msg.value(), msg.headers())
        except UndecodableEvent as e:
            dead.publish(msg, stage="weights.decode", reason=str(e), error_type=type(e).__name__)
            return
        try:
            # transient (Kafka) errors: the same event again until it succeeds or the service stops
            call(lambda: self.policy.on_checkpoint(ev),   # the gate times and counts itself (metrics.py)
                 retry_on=(Unavailable, DeliveryError), what="checkpoint handling", attempts=None,
                 first_s=1.0, max_s=30.0, stop=self._stop, log=log)
        except (Unavailable, DeliveryError):
            return  # stopping: the record stays uncommitted and is redelivered
        except (NotFound, InvalidRequest, FailedPrecondition) as e:
            dead.publish(msg, stage="weights.checkpoint", reason=str(e), error_type=type(e).__name__,
                         tenant=ev.envelope.tenant or "unknown")
        except Exception as e:  # noqa: BLE001 - a bug must not stall the stream; keep the record
            log.exception("checkpoint handling failed")
            dead.publish(msg, stage="weights.checkpoint", reason=f"{type(e).__name__}: {e}",
                         error_type=type(e).__name__, tenant=ev.envelope.tenant or "unknown")
