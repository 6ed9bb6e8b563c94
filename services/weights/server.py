"""Wiring: gRPC `apprentice.v1.Weights` + the checkpoints consumer + the model-updates producer + GC.

    Upload chunks --> store;  store --> Download chunks;  CheckpointPublished --> eval gate --> policy;
    Promote/Canary/Rollback --> ModelUpdate on model-updates;  PodHeartbeat --> Status, canary review.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from services.weights import audit_trail
from services.weights.audit_trail import Trail
from services.weights.blobstore import make_blob_store
from services.weights.config import WeightsSettings
from services.weights.evaluator import Evaluator
from services.weights.manifests import VERSION_RE
from services.weights.metrics import DOWNLOAD_BYTES, ORDERS, PODS, UPLOAD_BYTES, UPLOADS
from services.weights.names import validate_model, validate_pod_id, validate_tenant, validate_version
from services.weights.orders import OrderDesk
from services.weights.pods import PodRegistry
from services.weights.policy import PromotionPolicy
from services.weights.quotas import UploadLimits, UploadQuotas
from services.weights.store import WeightStore, validate_header
from services.weights.wire import SERVICE_NAME, encode_chunk, register
from shared.audit import AuditLog
from shared.events import UndecodableEvent
from shared.grpc_util import (
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Unavailable,
    create_server,
    graceful_stop,
    grpc_errors,
    require,
    set_serving,
)
from shared.kafka import DeadLetterPublisher, DeliveryError, EventConsumer, EventProducer
from shared.orders import BASE
from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc
from shared.retry import Backoff, call
from shared.security.identity import acting_as, current_identity
from shared.validation import decode_record

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 1000
"""An operator's reason travels in orders, manifests and audit records: a sentence, not a document."""
MAX_ENDPOINT_CHARS = 255




class WeightsServicer(weights_pb2_grpc.WeightsServicer):
    def __init__(self, svc: WeightsService) -> None:
        self.svc = svc
        self.s = svc.settings

    # --- bytes in / out --------------------------------------------------------------------------------
    @grpc_errors
    def Upload(self, request_iterator: Iterator[weights_pb2.UploadRequest], context: Any) -> weights_pb2.Manifest:
        first = next(iter(request_iterator), None)
        require(first is not None and first.WhichOneof("part") == "header",
                "the first message of an Upload must be the header")
        assert first is not None
        validate_header(first.header, sys.maxsize)  # names and shapes first; the size is the quota's question
        identity = current_identity()
        who = identity.key_id if identity is not None else "anonymous"
        with self.svc.quotas.reserve(who, sum(f.size for f in first.header.files)):
            return self._upload(first.header, request_iterator)

    def _upload(self, header: weights_pb2.UploadHeader,
                request_iterator: Iterator[weights_pb2.UploadRequest]) -> weights_pb2.Manifest:
        session = self.svc.store.begin_upload(header, self.s.max_upload_bytes)
        outcome = "rejected"
        try:
            for req in request_iterator:
                require(req.WhichOneof("part") == "chunk", "an Upload has exactly one header, then chunks")
                require(len(req.chunk.data) <= self.s.max_chunk_size,
                        f"chunk of {len(req.chunk.data)} bytes exceeds the limit of {self.s.max_chunk_size}")
                session.add(req.chunk)
            manifest = session.finish()
            outcome = "accepted"
            UPLOAD_BYTES.inc(session.bytes_received)
            log.info("version stored", extra={"model": manifest.model, "version": manifest.version,
                                              "kind": manifest.kind, "bytes": session.bytes_received})
            self.svc.request_gc()
            return manifest
        finally:
            session.abort()
            UPLOADS.labels(outcome).inc()

    @grpc_errors
    def Download(self, request: weights_pb2.DownloadRequest, context: Any) -> Iterator[bytes]:
        validate_model(request.model)
        require(request.offset >= 0 and request.length >= 0, "offset and length must be >= 0")
        require(request.offset == 0 or bool(request.path), "offset needs path (resume one file)")
        require(request.length == 0 or bool(request.path), "length needs path (a range of one file)")
        require(0 <= request.chunk_size <= self.s.max_chunk_size,
                f"chunk_size must be in [0, {self.s.max_chunk_size}] (0 = server default)")
        chunk_size = request.chunk_size or self.s.chunk_size
        version = request.version or self.svc.store.state(request.model).serving_for("")
        if version == BASE:
            raise FailedPrecondition("the base model is not stored here: every pod loads it from APPRENTICE_MODEL")
        m = self.svc.store.get(request.model, version)
        entries = list(m.files)
        if request.path:
            entries = [e for e in entries if e.path == request.path]
            if not entries:
                raise NotFound(f"{m.model} {m.version} has no file {request.path!r}")
            require(request.offset + request.length <= entries[0].size,
                    f"offset {request.offset} + length {request.length} is past the end of {request.path!r} "
                    f"({entries[0].size} bytes)")
        manifest: weights_pb2.Manifest | None = m  # rides on the first chunk only
        buf = bytearray(chunk_size)  # reused: the file is read into it, then copied once into the message
        view = memoryview(buf)
        for e in entries:
            offset = request.offset if request.path else 0
            end = offset + request.length if request.length else e.size  # a range lets clients fetch in parallel
            with self.svc.store.open_file(m, e) as f:
                f.seek(offset)
                sent_one = False
                while offset < end or not sent_one:
                    n = f.readinto(view[:min(chunk_size, end - offset)]) if offset < end else 0  # type: ignore[attr-defined]
                    if offset < end and not n:
                        raise FailedPrecondition(f"{m.model} {m.version}: stored blob of {e.path!r} is shorter "
                                                 f"than its manifest ({offset} of {e.size} bytes)")
                    if not context.is_active():
                        return
                    # Pre-encoded DownloadChunk (wire.py): the payload is copied once on its way out.
                    wire = encode_chunk(view[:n], path=e.path, offset=offset, file_size=e.size,
                                        file_sha256=e.sha256, manifest=manifest)
                    DOWNLOAD_BYTES.inc(n)  # counted when handed to gRPC: a client may hang up after the last chunk
                    yield wire
                    manifest = None
                    sent_one = True
                    offset += n

    # --- versions --------------------------------------------------------------------------------------
    @grpc_errors
    def List(self, request: weights_pb2.ListVersionsRequest, context: Any) -> weights_pb2.ListVersionsResponse:
        return weights_pb2.ListVersionsResponse(versions=self.svc.store.list(request.model))

    @grpc_errors
    def Get(self, request: weights_pb2.GetVersionRequest, context: Any) -> weights_pb2.Manifest:
        validate_model(request.model)  # version "" = what the operator slot serves, as in Download
        return self.svc.store.get(request.model,
                                  request.version or self.svc.store.state(request.model).serving_for(""))

    @grpc_errors
    def Pin(self, request: weights_pb2.PinRequest, context: Any) -> weights_pb2.Manifest:
        validate_model(request.model)
        validate_version(request.version)
        require(request.version != BASE, "the base model is always available; it needs no pin")
        m = self.svc.store.get(request.model, request.version)  # NOT_FOUND before anything is recorded
        self.svc.desk.audit.allowed(audit_trail.PIN if request.pinned else audit_trail.UNPIN, m.model, m.version,
                                    tenant=m.tenant)

        def pin(m: weights_pb2.Manifest) -> None:
            m.pinned = request.pinned

        return self.svc.store.update(request.model, request.version, pin)

    # --- orders ----------------------------------------------------------------------------------------
    @grpc_errors
    def Promote(self, request: weights_pb2.PromoteRequest, context: Any) -> weights_pb2.OrderAck:
        validate_model(request.model)
        require(bool(request.version), "version is required")
        validate_version(request.version)
        require(len(request.reason) <= MAX_REASON_CHARS, f"reason longer than {MAX_REASON_CHARS} characters")
        identity = current_identity()
        if request.force and identity is not None and not (identity.is_operator or identity.is_anonymous):
            # A service (the trainer, a pipeline) promotes only through the eval gate; skipping it is the
            # operator's call, made with an operator key and recorded.
            why = (f"force=true needs an operator key; {identity.role.value} key {identity.key_id!r} may promote "
                   "only through the eval gate (retry without force)")
            self.svc.desk.audit.refused(audit_trail.PROMOTE, request.model, request.version, reason=why,
                                        details={"force": "true"})
            raise PermissionDenied(why)
        return self.svc.desk.promote(request.model, request.version, force=request.force, reason=request.reason)

    @grpc_errors
    def Canary(self, request: weights_pb2.CanaryRequest, context: Any) -> weights_pb2.OrderAck:
        validate_model(request.model)
        require(bool(request.version), "version is required")
        validate_version(request.version)
        require(len(request.reason) <= MAX_REASON_CHARS, f"reason longer than {MAX_REASON_CHARS} characters")
        return self.svc.desk.canary(request.model, request.version, request.fraction, reason=request.reason)

    @grpc_errors
    def Rollback(self, request: weights_pb2.RollbackRequest, context: Any) -> weights_pb2.OrderAck:
        validate_model(request.model)
        if request.version:
            validate_version(request.version)
        require(len(request.reason) <= MAX_REASON_CHARS, f"reason longer than {MAX_REASON_CHARS} characters")
        tenant = request.tenant if request.HasField("tenant") else None
        if tenant is not None:
            validate_tenant(tenant)
        return self.svc.desk.rollback(request.model, request.version, tenant=tenant, reason=request.reason)

    # --- pods ------------------------------------------------------------------------------------------
    @grpc_errors
    def Status(self, request: weights_pb2.StatusRequest, context: Any) -> weights_pb2.StatusResponse:
        validate_model(request.model)
        return self.svc.status(request.model)

    @grpc_errors
    def Heartbeat(self, request: weights_pb2.PodHeartbeat, context: Any) -> weights_pb2.HeartbeatAck:
        validate_pod_id(request.pod_id)
        validate_model(request.model)
        require(0 <= request.canary_fraction <= 1, "canary_fraction must be in [0, 1]")
        require(request.canary_requests >= 0 and request.canary_errors >= 0, "canary counts must be >= 0")
        require(request.canary_errors <= request.canary_requests,
                "canary_errors counts failed canary requests, so it cannot exceed canary_requests")
        require(len(request.endpoint) <= MAX_ENDPOINT_CHARS, f"endpoint longer than {MAX_ENDPOINT_CHARS} characters")
        for field_name, versions in (("tenant_versions", request.tenant_versions),
                                     ("tenant_canaries", request.tenant_canaries)):
            for tenant, version in versions.items():
                validate_tenant(tenant, f"{field_name} key")
                require(not version or VERSION_RE.fullmatch(version) is not None,
                        f"{field_name}[{tenant!r}] = {version[:60]!r} is not a version name")
        state = self.svc.store.state(request.model)
        self.svc.pods.record(request, state, identity=current_identity())
        if state.slots and any(s.canary for s in state.slots.values()):
            with acting_as(audit_trail.SELF):  # the verdict is the service's, from every pod's reports
                self.svc.review_canaries(request.model)
            state = self.svc.store.state(request.model)
        return weights_pb2.HeartbeatAck(promoted_version=state.serving_for(""),
                                        desired=self.svc.desk.desired(request.model))


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
        self.store = WeightStore(make_blob_store(s.store_backend, s.store_root), s.store_root)
        self.pods = PodRegistry(max_pods_per_identity=s.max_pods_per_identity, max_pods=s.max_pods,
                                forget_s=s.pod_forget_s)
        self.quotas = UploadQuotas(UploadLimits(
            max_upload_bytes=s.max_upload_bytes, max_uploads_per_identity=s.max_uploads_per_identity,
            max_bytes_per_identity=s.max_upload_bytes_per_identity, max_bytes_total=s.max_upload_bytes_in_flight))
        self._producer: EventProducer | None = None
        self._producer_lock = threading.Lock()
        self._audit_log: AuditLog | None = None
        self.evaluator = Evaluator(self.store, s)
        self.desk = OrderDesk(self.store, self._publish, source="weights", weights_endpoint=s.advertised_endpoint,
                              gate=self._gate, integrity=self.evaluator.check_integrity,
                              audit=Trail(self._audit_record))
        self.policy = PromotionPolicy(self.store, self.desk, self.evaluator, s)
        self._stop = threading.Event()
        self._gc_wanted = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lagging_logged: set[tuple[str, str, str]] = set()
        self._review_lock = threading.Lock()  # pods beat concurrently: one canary verdict at a time

    # --- effects ---------------------------------------------------------------------------------------
    @property
    def producer(self) -> EventProducer:
        """Created on first use: a store that only serves bytes (benchmarks, tests) needs no broker."""
        with self._producer_lock:
            if self._producer is None:
                self._producer = EventProducer(self.settings.common.kafka_bootstrap, client_id="weights")
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
    def start_background(self, consume: bool = True) -> None:
        targets = [self._gc_loop, self._watchdog_loop] + ([self._consume_loop] if consume else [])
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
                self.store.collect(self.settings.keep_last)
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

    def _consume_loop(self) -> None:
        s = self.settings
        consumer = EventConsumer(s.common.kafka_bootstrap, self.topics.group_id(s.consumer_group),
                                 [self.topics.checkpoints])
        dead = DeadLetterPublisher(self.producer, self.topics.deadletter, source="weights")
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
            ev = decode_record(events_pb2.CheckpointPublished, msg.value(), msg.headers())
        except UndecodableEvent as e:
            dead.publish(msg, stage="weights.decode", reason=str(e), error_type="UndecodableEvent")
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


@dataclass
class RunningServer:
    service: WeightsService
    server: grpc.Server
    port: int
    health: Any

    def stop(self, grace: float | None = None) -> None:
        graceful_stop(self.server, self.health, self.service.settings.grace_s if grace is None else grace)
        self.service.stop()


def start(settings: WeightsSettings, *, consume: bool = True) -> RunningServer:
    """Build and start everything; tests pass port 0 and read `.port`."""
    svc = WeightsService(settings)
    servicer = WeightsServicer(svc)
    server, port, health = create_server(settings.port, lambda srv: register(servicer, srv), [SERVICE_NAME],
                                         host=settings.host, common=settings.common)
    server.start()
    svc.start_background(consume=consume)
    set_serving(health, [SERVICE_NAME])
    log.info("weights service serving", extra={"port": port, "store": str(settings.store_root),
                                               "policy": settings.policy})
    return RunningServer(svc, server, port, health)


def run(settings: WeightsSettings) -> int:
    """Serve until SIGINT/SIGTERM, then drain in-flight calls."""
    from shared.grpc_util import service_host
    from shared.kafka import ensure_topics
    from shared.metrics import start_metrics_server

    ensure_topics(settings.common.kafka_bootstrap, settings.common.topics)
    start_metrics_server(settings.metrics_port, service_host(settings.host, settings.common))
    running = start(settings)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    running.stop()
    return 0
