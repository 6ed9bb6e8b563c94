"""Upload streams --> verified, deduplicated blobs + a versioned `Manifest`; manifests --> bytes back.

The store is the one place that decides what exists: a version becomes visible only when every file it
declares has arrived with the declared size and sha256 (blobs committed first, manifest written last,
both under the store lock). Versions are numbered `v1`, `v2`, ... per model unless the uploader names
one; `base` is the implicit version every pod loads locally from APPRENTICE_MODEL.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import grpc

from services.weights.blobstore import SHA256_RE, BlobStore, BlobWriter
from services.weights.manifests import ManifestStore, ModelState
from services.weights.metadata import validate_metadata
from services.weights.names import validate_model, validate_path, validate_tenant, validate_version
from services.weights.retention import unreferenced, versions_to_keep
from shared.contracts.events import timestamp
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import FailedPrecondition, InvalidRequest, NotFound, ServiceError, require
from shared.weights.formats import pickle_bearing, refusal

log = logging.getLogger(__name__)

KINDS = ("full", "lora")


class AlreadyExists(ServiceError):
    """A version with this name exists with different content; pick another name or let the store number it."""

    code = grpc.StatusCode.ALREADY_EXISTS


def validate_header(header: weights_pb2.UploadHeader, max_bytes: int) -> None:
    validate_model(header.model)
    if header.version:
        validate_version(header.version)
        require(header.version != BASE, "'base' is the implicit base model; it cannot be uploaded")
    require(header.kind in KINDS, f"kind must be one of {', '.join(KINDS)} (got {header.kind!r})")
    for name, value in (("parent_version", header.parent_version), ("base_version", header.base_version)):
        if value:
            validate_version(value, name)
    validate_tenant(header.tenant)
    validate_metadata(header)
    require(len(header.files) > 0, "an upload declares at least one file")
    require(len(header.files) <= 1000, "an upload declares at most 1000 files")
    seen: set[str] = set()
    total = 0
    for f in header.files:
        validate_path(f.path)
        require(not pickle_bearing(f.path), refusal(f.path))
        require(f.path not in seen, f"file {f.path!r} declared twice")
        seen.add(f.path)
        require(f.size >= 0, f"file {f.path!r}: size must be >= 0")
        require(SHA256_RE.match(f.sha256) is not None, f"file {f.path!r}: sha256 must be 64 lowercase hex digits")
        total += f.size
    require(total <= max_bytes, f"upload declares {total} bytes, more than the limit of {max_bytes}")


@dataclass
class _Incoming:
    entry: weights_pb2.FileEntry
    writer: BlobWriter | None = None
    received: int = 0


@dataclass
class GcReport:
    deleted_versions: list[str] = field(default_factory=list)   # "model/version"
    deleted_blobs: int = 0
    freed_bytes: int = 0
    removed_temporary: int = 0


class UploadSession:
    """One Upload call: chunks in order per file, verified at the end, nothing visible before `finish`."""

    def __init__(self, store: WeightStore, header: weights_pb2.UploadHeader, max_bytes: int) -> None:
        validate_header(header, max_bytes)
        self.store = store
        self.header = header
        self.files = {f.path: _Incoming(f) for f in header.files}
        self.bytes_received = 0

    def add(self, chunk: weights_pb2.FileChunk) -> None:
        inc = self.files.get(chunk.path)
        require(inc is not None, f"chunk for undeclared file {chunk.path!r}")
        assert inc is not None
        require(chunk.offset == inc.received,
                f"file {chunk.path!r}: chunk at offset {chunk.offset}, expected {inc.received} (chunks go in order)")
        require(inc.received + len(chunk.data) <= inc.entry.size,
                f"file {chunk.path!r}: more bytes than the declared {inc.entry.size}")
        if inc.writer is None:
            inc.writer = self.store.blobs.writer()
        inc.writer.write(chunk.data)
        inc.received += len(chunk.data)
        self.bytes_received += len(chunk.data)

    def finish(self) -> weights_pb2.Manifest:
        """Verify every file, commit the blobs and write the manifest; reject the whole upload otherwise."""
        try:
            for path, inc in self.files.items():
                e = inc.entry
                if inc.writer is None:
                    if e.size == 0:
                        inc.writer = self.store.blobs.writer()
                    elif self.store.blobs.exists(e.sha256) and self.store.blobs.size(e.sha256) == e.size:
                        continue  # the store already holds these bytes: the client may skip them
                    else:
                        raise InvalidRequest(f"file {path!r}: no bytes received (declared {e.size})")
                if inc.received != e.size:
                    raise InvalidRequest(f"file {path!r} truncated: received {inc.received} of {e.size} bytes")
                if inc.writer.sha256 != e.sha256:
                    raise InvalidRequest(f"file {path!r}: sha256 mismatch: received {inc.writer.sha256}, "
                                         f"declared {e.sha256}")
            with self.store.transaction():
                for path, inc in self.files.items():
                    if inc.writer is not None:
                        inc.writer.commit(inc.entry.sha256, inc.entry.size)
                    elif not self.store.blobs.exists(inc.entry.sha256):  # collected since the check above
                        raise FailedPrecondition(f"file {path!r}: skipped as already stored, but its blob was "
                                                 "just garbage-collected; upload it again")
                return self.store._add_version(self.header)
        finally:
            self.abort()

    def abort(self) -> None:
        for inc in self.files.values():
            if inc.writer is not None:
                inc.writer.abort()


class WeightStore:
    def __init__(self, blobs: BlobStore, root: Path) -> None:
        self.blobs = blobs
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifests = ManifestStore(self.root)
        self._lock = threading.RLock()
        self._depth = 0
        self._lock_file = self.root / ".lock"

    # --- locking ---------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Serialise mutations: a thread lock, plus a file lock so several processes may share the root."""
        with self._lock:
            fd = None
            if self._depth == 0:
                fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)

    # --- versions --------------------------------------------------------------------------------------
    def begin_upload(self, header: weights_pb2.UploadHeader, max_bytes: int = 64 << 30) -> UploadSession:
        return UploadSession(self, header, max_bytes)

    def _add_version(self, header: weights_pb2.UploadHeader) -> weights_pb2.Manifest:
        """Under the lock: name the version and write its manifest (the moment it becomes visible)."""
        state = self.manifests.load_state(header.model)
        if header.version:
            existing = self.manifests.load(header.model, header.version)
            if existing is not None:
                same = [(f.path, f.sha256) for f in existing.files] == [(f.path, f.sha256) for f in header.files]
                if same:
                    return existing  # a retried upload of the same checkpoint: idempotent
                raise AlreadyExists(f"{header.model} {header.version} already exists with other files")
            version = header.version
        else:
            n = state.next_number
            while self.manifests.exists(header.model, f"v{n}"):
                n += 1
            version = f"v{n}"
            state.next_number = n + 1
        m = weights_pb2.Manifest(
            model=header.model, version=version, base_model=header.base_model or header.model,
            parent_version=header.parent_version, kind=header.kind, files=list(header.files),
            data_offsets=list(header.data_offsets), algorithm=header.algorithm,
            status=weights_pb2.VERSION_STATUS_CANDIDATE, tenant=header.tenant,
            base_version=(header.base_version or BASE) if header.kind == "lora" else header.base_version,
        )
        m.training_metadata.update(header.training_metadata)
        m.train_metrics.update(header.train_metrics)
        m.created_at.CopyFrom(timestamp())
        self.manifests.save(m)
        self.manifests.save_state(state)
        return m

    def base_manifest(self, model: str) -> weights_pb2.Manifest:
        return weights_pb2.Manifest(
            model=model, version=BASE, base_model=model, kind="full", status=weights_pb2.VERSION_STATUS_APPROVED,
            status_reason="the base model: every pod loads it locally from APPRENTICE_MODEL")

    def get(self, model: str, version: str) -> weights_pb2.Manifest:
        validate_model(model)
        require(bool(version), "version must not be empty")
        if version == BASE:
            return self.base_manifest(model)
        validate_version(version)
        m = self.manifests.load(model, version)
        if m is None:
            raise NotFound(f"{model} has no version {version!r}")
        return m

    def list(self, model: str) -> list[weights_pb2.Manifest]:
        validate_model(model)
        return self.manifests.list(model)

    def update(self, model: str, version: str,
               mutate: Callable[[weights_pb2.Manifest], None]) -> weights_pb2.Manifest:
        """Load, change and save one manifest under the lock."""
        with self.transaction():
            m = self.get(model, version)
            require(version != BASE, "the base version has no manifest to change")
            mutate(m)
            self.manifests.save(m)
            return m

    def state(self, model: str) -> ModelState:
        return self.manifests.load_state(model)

    def save_state(self, state: ModelState) -> None:
        with self.transaction():
            self.manifests.save_state(state)

    # --- bytes out -------------------------------------------------------------------------------------
    def open_file(self, manifest: weights_pb2.Manifest, entry: weights_pb2.FileEntry) -> BinaryIO:
        try:
            return self.blobs.open(entry.sha256)
        except FileNotFoundError:
            raise FailedPrecondition(f"{manifest.model} {manifest.version}: blob of {entry.path!r} is missing "
                                     "from the store (deleted or never committed)") from None

    def materialise(self, manifest: weights_pb2.Manifest, dest: Path) -> Path:
        """Lay the version's files out under `dest` (hard links when the backend is local, else copies)."""
        dest.mkdir(parents=True, exist_ok=True)
        for e in manifest.files:
            target = dest / e.path
            target.parent.mkdir(parents=True, exist_ok=True)
            src = self.blobs.local_path(e.sha256)
            if src is not None and src.exists():
                target.unlink(missing_ok=True)
                try:
                    os.link(src, target)
                    continue
                except OSError:
                    pass
            with self.open_file(manifest, e) as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout, 4 << 20)
        return dest

    # --- retention -------------------------------------------------------------------------------------
    def collect(self, keep_last: int, temporary_older_than_s: float = 6 * 3600,
                also_keep: Collection[str] = ()) -> GcReport:
        """Delete versions outside the retention rule, then blobs no remaining manifest references.
        `also_keep`: version names kept in every model (the eval gate's configured references)."""
        report = GcReport()
        with self.transaction():
            kept: list[weights_pb2.Manifest] = []
            for model in self.manifests.models():
                manifests = self.manifests.list(model)
                keep = versions_to_keep(manifests, self.manifests.load_state(model), keep_last, also_keep)
                for m in manifests:
                    if m.version in keep:
                        kept.append(m)
                    elif self.manifests.delete(model, m.version):
                        report.deleted_versions.append(f"{model}/{m.version}")
            for sha in sorted(unreferenced(self.blobs.list(), kept)):
                try:
                    size = self.blobs.size(sha)
                except FileNotFoundError:
                    continue
                if self.blobs.delete(sha):
                    report.deleted_blobs += 1
                    report.freed_bytes += size
            report.removed_temporary = self.blobs.clean_temporary(temporary_older_than_s)
        if report.deleted_versions or report.deleted_blobs:
            log.info("garbage collected", extra={"versions": ",".join(report.deleted_versions),
                                                 "blobs": report.deleted_blobs, "freed_bytes": report.freed_bytes})
        return report
