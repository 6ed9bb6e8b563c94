"""gRPC `apprentice.v1.Weights` --> the WeightsService (registry.py): every call's checks, then the store,
the order desk or the pod registry.

    Upload chunks --> store;  store --> Download chunks;  Promote/Canary/Rollback --> the order desk;
    PodHeartbeat --> the pod registry, canary review.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.weights import audit_trail
from services.weights.manifests import VERSION_RE
from services.weights.metadata import bounded
from services.weights.metrics import DOWNLOAD_BYTES, UPLOAD_BYTES, UPLOADS
from services.weights.names import validate_model, validate_pod_id, validate_tenant, validate_version
from services.weights.store import validate_header
from services.weights.wire import encode_chunk
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.rpc.grpc_util import FailedPrecondition, NotFound, PermissionDenied, grpc_errors, require
from shared.security.identity import acting_as, current_identity

if TYPE_CHECKING:
    from services.weights.registry import WeightsService

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
        manifest: weights_pb2.Manifest | None = bounded(m)  # rides on the first chunk only
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
        # Each manifest trimmed to the metadata bound: one stored before it must not break every listing.
        return weights_pb2.ListVersionsResponse(versions=[bounded(m) for m in self.svc.store.list(request.model)])

    @grpc_errors
    def Get(self, request: weights_pb2.GetVersionRequest, context: Any) -> weights_pb2.Manifest:
        validate_model(request.model)  # version "" = what the operator slot serves, as in Download
        return bounded(self.svc.store.get(request.model,
                                          request.version or self.svc.store.state(request.model).serving_for("")))

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

        return bounded(self.svc.store.update(request.model, request.version, pin))

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
