"""Checkpoint files <--> the Weights service, and model <--> checkpoint files.

Used by the trainer (save + upload), inference pods (download + load for hot swap) and the weights
eval gate (load). File layout of a version:
- full: `model.safetensors` (or shards), `config.json`, `generation_config.json`
- lora: `adapter_model.safetensors`, `adapter_config.json` (peft's format); applied to the base model
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import itertools
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from shared.proto.apprentice.v1 import weights_pb2
from shared.retry import call

CHUNK = 1 << 20  # 1 MiB: large enough for throughput, small enough for gRPC's default message limits
FULL, LORA = "full", "lora"
TRAINED_INTERACTIONS = "trained_interactions.json"
"""A version's provenance file: the sorted ids of the interactions it learned from (JSON list), written
by the trainer into every checkpoint, so it is uploaded, checksummed and kept with the weights."""


class WeightsIntegrityError(RuntimeError):
    """Downloaded bytes do not match the manifest. Not recoverable by retrying the same bytes."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def file_entries(src_dir: Path) -> list[weights_pb2.FileEntry]:
    files = sorted(p for p in Path(src_dir).rglob("*") if p.is_file())
    return [weights_pb2.FileEntry(path=str(p.relative_to(src_dir)), size=p.stat().st_size, sha256=sha256_file(p))
            for p in files]


def write_trained_interactions(weights_dir: Path, ids: list[str]) -> int:
    """Write `TRAINED_INTERACTIONS` (sorted, unique ids) into a version's folder; returns the count."""
    ordered = sorted(set(ids))
    Path(weights_dir).mkdir(parents=True, exist_ok=True)
    (Path(weights_dir) / TRAINED_INTERACTIONS).write_text(json.dumps(ordered), encoding="utf-8")
    return len(ordered)


def read_version_file(stub: Any, model: str, version: str, path: str, *, max_bytes: int = 64 << 20,
                      timeout: float = 60.0) -> bytes:
    """One small file of a stored version (`Weights.Download` with `path`), checked against the manifest's
    size and sha256: a provenance file is evidence, so a corrupted copy must fail, not be believed."""
    manifest = stub.Get(weights_pb2.GetVersionRequest(model=model, version=version), timeout=timeout)
    entry = next((f for f in manifest.files if f.path == path), None)
    if entry is None:
        raise FileNotFoundError(f"{model} {version} has no file {path!r}")
    if entry.size > max_bytes:
        raise ValueError(f"{model} {version} {path}: {entry.size} bytes, over the limit of {max_bytes}")
    buf = bytearray()
    for chunk in stub.Download(weights_pb2.DownloadRequest(model=model, version=version, path=path), timeout=timeout):
        buf += chunk.data
    if len(buf) != entry.size or hashlib.sha256(buf).hexdigest() != entry.sha256:
        raise WeightsIntegrityError(f"{model} {version} {path}: the bytes received do not match the manifest")
    return bytes(buf)


# --- upload / download ------------------------------------------------------------------------------
def _upload_stream(header: weights_pb2.UploadHeader, src_dir: Path) -> Iterator[weights_pb2.UploadRequest]:
    yield weights_pb2.UploadRequest(header=header)
    for entry in header.files:
        with open(Path(src_dir) / entry.path, "rb") as f:
            offset = 0
            while block := f.read(CHUNK):
                yield weights_pb2.UploadRequest(chunk=weights_pb2.FileChunk(path=entry.path, offset=offset, data=block))
                offset += len(block)


def upload_version(stub: Any, header: weights_pb2.UploadHeader, src_dir: Path | str,
                   timeout: float = 600.0) -> weights_pb2.Manifest:
    """Stream every file under `src_dir` to `Weights.Upload`; the header's file list is filled in here
    (sizes + sha256), so the server can reject any mismatch. Returns the stored manifest."""
    src = Path(src_dir)
    h = weights_pb2.UploadHeader()
    h.CopyFrom(header)
    del h.files[:]
    h.files.extend(file_entries(src))
    return stub.Upload(_upload_stream(h, src), timeout=timeout)


class DownloadSource(Protocol):
    """What `download_version` calls: a `WeightsStub`, or a `DownloadClient` (faster: see there)."""

    def Get(self, request: weights_pb2.GetVersionRequest, timeout: float | None = None) -> weights_pb2.Manifest: ...

    def Download(self, request: weights_pb2.DownloadRequest, timeout: float | None = None) -> Any: ...


class DownloadPart:
    """One `DownloadChunk` decoded by hand: `data` is a view into the received message, not a copy.

    Parsing a chunk with the protobuf runtime copies its payload twice more (into the message, then into a
    new `bytes` on each `.data` access): about 0.5 s of CPU, with the GIL held, per 538 MB on the 2-core
    dev machine, a third of the whole transfer. Same attribute names as `weights_pb2.DownloadChunk`.
    """

    __slots__ = ("path", "offset", "data", "file_size", "file_sha256", "manifest")

    def __init__(self) -> None:
        self.path = ""
        self.offset = 0
        self.data: bytes | memoryview = b""
        self.file_size = 0
        self.file_sha256 = ""
        self.manifest: weights_pb2.Manifest | None = None

    def HasField(self, name: str) -> bool:  # noqa: N802 - mirrors the protobuf API
        if name != "manifest":
            raise ValueError(f"DownloadPart has no message field {name!r}")
        return self.manifest is not None


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("malformed DownloadChunk: varint longer than 10 bytes")


def decode_chunk(buf: bytes) -> DownloadPart:
    """Wire bytes of a `DownloadChunk` --> `DownloadPart` (the protobuf encoding; unknown fields skipped)."""
    part = DownloadPart()
    view = memoryview(buf)
    i, n = 0, len(buf)
    try:
        while i < n:
            key, i = _varint(buf, i)
            field_no, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _varint(buf, i)
                if field_no == 2:
                    part.offset = value
                elif field_no == 4:
                    part.file_size = value
            elif wire == 2:
                size, i = _varint(buf, i)
                if i + size > n:
                    raise ValueError("malformed DownloadChunk: field runs past the end")
                if field_no == 3:
                    part.data = view[i:i + size]
                elif field_no == 1:
                    part.path = bytes(view[i:i + size]).decode()
                elif field_no == 5:
                    part.file_sha256 = bytes(view[i:i + size]).decode()
                elif field_no == 6:
                    if part.manifest is None:
                        part.manifest = weights_pb2.Manifest()
                    part.manifest.MergeFromString(view[i:i + size])
                i += size
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                raise ValueError(f"malformed DownloadChunk: wire type {wire}")
    except IndexError:
        raise ValueError("malformed DownloadChunk: truncated") from None
    if i != n:
        raise ValueError("malformed DownloadChunk: truncated")
    return part


DOWNLOAD_METHOD = "/apprentice.v1.Weights/Download"
MAX_MESSAGE = 64 << 20  # the server's limit; chunks are at most 16 MiB


class DownloadClient:
    """`Get` + `Download` for one weights endpoint, built for bulk bytes; use as `download_version`'s source.

    - chunks are decoded by hand (`decode_chunk`: the payload is never copied by a parser);
    - `connections` channels, each on its own TCP connection (a local subchannel pool: gRPC otherwise
      shares one connection between channels with equal settings), which `Download` calls take in turn,
      so the range streams of one file (`download_version(..., streams=N)`) do not share one socket.
    """

    def __init__(self, endpoint: str, *, connections: int = 1) -> None:

        from shared.proto.apprentice.v1 import weights_pb2_grpc
        from shared.security.channels import open_channel

        options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.use_local_subchannel_pool", 1)]
        self._channels = [open_channel(endpoint, options=options) for _ in range(max(1, connections))]
        self._get = weights_pb2_grpc.WeightsStub(self._channels[0]).Get
        self._downloads = [c.unary_stream(DOWNLOAD_METHOD, request_serializer=weights_pb2.DownloadRequest.SerializeToString,
                                          response_deserializer=decode_chunk) for c in self._channels]
        self._turn = itertools.count()

    @property
    def connections(self) -> int:
        return len(self._channels)

    def Get(self, request: weights_pb2.GetVersionRequest, timeout: float | None = None) -> weights_pb2.Manifest:  # noqa: N802
        return self._get(request, timeout=timeout)

    def Download(self, request: weights_pb2.DownloadRequest, timeout: float | None = None) -> Any:  # noqa: N802
        return self._downloads[next(self._turn) % len(self._downloads)](request, timeout=timeout)

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> DownloadClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


MIN_RANGE = 64 << 20  # a file is split into parallel range streams only in pieces at least this large


def download_version(stub: DownloadSource, model: str, version: str, dest_dir: Path | str, *,
                     timeout: float = 600.0, attempts: int = 3, streams: int = 1,
                     chunk_size: int = 0, durable: bool = True) -> weights_pb2.Manifest:
    """Fetch a version into `dest_dir` atomically and durably; returns the manifest.

    Files land in `<dest>.partial/`; each is written with `pwrite` at its offset (files of at least
    2 x MIN_RANGE as up to `streams` parallel range streams, DownloadRequest.offset + length; one stream
    by default: on loopback the single sha256 stream, not the transport, bounds the speed, measured equal
    for 1, 2 and 4 streams and slower for 8 on 16 cores; more help where one HTTP/2 stream is bound by
    latency and flow-control windows, e.g. a remote store), hashed in file order by a second
    thread as its bytes land (sha256 releases the GIL, so hashing overlaps the transfer and the file is
    not read again afterwards), fsynced once, and verified against the manifest's sha256.
    Only then is the folder renamed into place (and the rename made durable), so a pod never loads a
    partial or corrupted version. An interrupted stream resumes from the bytes it already has, within this
    call (`attempts` per range) and across calls (the `.partial` folder is kept). `durable=False` skips the
    fsyncs (the bytes still reach the page cache; a crash may lose them).
    `stub`: a `WeightsStub`, or a `DownloadClient` (hand-decoded chunks, one connection per stream: faster).
    """
    dest = Path(dest_dir)
    manifest = stub.Get(weights_pb2.GetVersionRequest(model=model, version=version), timeout=timeout)
    tmp = dest.with_name(dest.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    dirs = {tmp}
    for entry in manifest.files:
        _check_relative(entry.path)
        target = tmp / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        dirs.add(target.parent)
        fetch = _FileFetch(stub, model, manifest.version, entry, target, streams=streams, chunk_size=chunk_size,
                           timeout=timeout, attempts=attempts, durable=durable)
        fetch.run()
    if durable:
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            _fsync_dir(d)  # the files' directory entries, deepest first
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    if durable:
        _fsync_dir(dest.parent)  # the rename itself
    return manifest


def _check_relative(path: str) -> None:
    parts = Path(path).parts
    if not path or Path(path).is_absolute() or any(p in ("..", ".") for p in parts):
        raise WeightsIntegrityError(f"manifest file path {path!r} is not a plain relative path")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


WRITEBACK_STEP = 32 << 20
"""Bytes of a file between two early-writeback requests (see `start_writeback`)."""
_SYNC_FILE_RANGE_WRITE = 2


def _libc_sync_file_range() -> Any:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None  # not Linux: fsync at the end does all the work
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range()


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing [offset, offset + nbytes) of `fd` to disk, without waiting
    (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`, as RocksDB's `bytes_per_sync`).

    A durable download otherwise leaves the whole file dirty until its final fsync, which then writes
    every byte after the transfer instead of during it (on the dev machine, 0.3-0.7 s per 538 MB after
    the last chunk). With writeback started behind the transfer, the final fsync only waits for the
    tail. Not a durability point by itself: the fsync still decides. Best effort (a no-op elsewhere)."""
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


WRITE_PIECE = 256 << 10
"""Largest single `pwrite`. Measured on the dev VM (Linux 6.18, ext4): writing 512 MiB of new page cache
after a few idle seconds takes 1.7-2.1 s in 4 MiB writes and 0.14-0.17 s in 64 KiB-1 MiB writes (warm,
both about 0.2 s; a kernel copy of the same bytes, 0.2 s either way). Measured, not explained: most
likely large page-cache folios for large writes, backed after idle by memory the hypervisor took back.
A pod downloads after being idle, so this is its case."""


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view[:WRITE_PIECE], offset)
        view = view[n:]
        offset += n


class _OrderedHasher:
    """sha256 of a file whose byte ranges are written out of order, computed in file order as soon as each
    prefix is complete, on a thread of its own (sha256 releases the GIL: hashing overlaps the transfer).

    Writers call `written(offset, data)` after writing `data` at `offset`. The hasher hashes those bytes
    from memory while it keeps up; chunks beyond `window` bytes of backlog are dropped from memory and
    read back from the file (page cache) when their turn comes, so memory stays bounded however far the
    parallel ranges run ahead. `contiguous` is the length of the complete prefix on disk: where a later
    call resumes if this one fails. `writeback`: also start the disk writeback of each hashed stretch
    (`start_writeback`), so that a durable download's final fsync has little left to do.
    """

    def __init__(self, fd: int, size: int, *, window: int = 64 << 20, writeback: bool = False) -> None:
        self.fd = fd
        self.writeback = writeback
        self.size = size
        self.window = window
        self.contiguous = 0
        self._pending: dict[int, tuple[int, bytes | memoryview | None]] = {}  # offset -> (end, data or None)
        self._held = 0  # bytes referenced by _pending
        self._ends: dict[int, int] = {}
        self._cv = threading.Condition()
        self._stopped = False
        self._hash = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="download-hasher", daemon=True)
        self._thread.start()

    def written(self, offset: int, data: bytes | memoryview | None, n: int | None = None) -> None:
        """`n` bytes (default len(data)) at `offset` are in the file; `data` None = read them back later."""
        if n is None:
            if data is None:
                raise TypeError("written(): `n` is required when `data` is None")
            n = len(data)
        with self._cv:
            keep = data is not None and self._held + n <= self.window
            self._pending[offset] = (offset + n, data if keep else None)
            self._held += n if keep else 0
            self._ends[offset] = offset + n
            advanced = False
            while self.contiguous in self._ends:
                self.contiguous = self._ends.pop(self.contiguous)
                advanced = True
            if advanced:
                self._cv.notify()

    def _run(self) -> None:
        buf = memoryview(bytearray(0))
        hashed = synced = 0
        try:
            while hashed < self.size:
                if self.writeback and hashed - synced >= WRITEBACK_STEP:
                    start_writeback(self.fd, synced, hashed - synced)
                    synced = hashed
                with self._cv:
                    while hashed not in self._pending and not self._stopped:
                        self._cv.wait()
                    if self._stopped:
                        return
                    end, data = self._pending.pop(hashed)
                    if data is not None:
                        self._held -= end - hashed
                if data is not None:
                    self._hash.update(data)
                    hashed = end
                    continue
                if len(buf) < min(end - hashed, 4 << 20):
                    buf = memoryview(bytearray(min(end - hashed, 4 << 20)))
                while hashed < end:  # dropped from memory: read it back from the page cache
                    got = os.preadv(self.fd, [buf[:min(len(buf), end - hashed)]], hashed)
                    if got <= 0:
                        raise WeightsIntegrityError(f"short read at byte {hashed} while hashing")
                    self._hash.update(buf[:got])
                    hashed += got
        except BaseException as e:  # noqa: BLE001 - re-raised by digest()
            self._error = e

    def digest(self, timeout: float | None = None) -> str:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("hashing did not finish")
        if self._error is not None:
            raise self._error
        return self._hash.hexdigest()

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join()


class _FileFetch:
    """One file of a version: parallel range streams --> pwrite --> ordered sha256 --> fsync --> verify."""

    def __init__(self, source: DownloadSource, model: str, version: str, entry: weights_pb2.FileEntry,
                 target: Path, *, streams: int, chunk_size: int, timeout: float, attempts: int,
                 durable: bool) -> None:
        self.source, self.model, self.version, self.entry, self.target = source, model, version, entry, target
        self.streams, self.chunk_size, self.timeout, self.attempts = streams, chunk_size, timeout, max(1, attempts)
        self.durable = durable
        # Present while ranges are written out of order: after a crash, the file's size says nothing
        # about which bytes arrived, so the next call starts this file over instead of resuming it.
        self.marker = target.with_name(f".{target.name}.{entry.sha256[:16]}.inflight")
        self._abort = threading.Event()

    def ranges(self, have: int) -> list[tuple[int, int]]:
        left = self.entry.size - have
        k = max(1, min(self.streams, left // MIN_RANGE))
        step = -(-left // k)
        return [(a, min(a + step, self.entry.size)) for a in range(have, self.entry.size, step)]

    def run(self) -> None:
        e = self.entry
        if self.marker.exists():
            self.target.unlink(missing_ok=True)
        fd = os.open(self.target, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            have = os.fstat(fd).st_size
            if have > e.size:
                os.ftruncate(fd, 0)
                have = 0
            ranges = self.ranges(have) if have < e.size else []
            if len(ranges) > 1:
                self.marker.touch()
            hasher = _OrderedHasher(fd, e.size, writeback=self.durable)
            try:
                if have:
                    hasher.written(0, None, have)  # bytes of an interrupted earlier call: read back and hashed
                self._fetch_ranges(fd, hasher, ranges)
                if self.durable:
                    os.fsync(fd)  # once, while the hasher finishes: the durable equivalent of syncing each chunk
                got = hasher.digest(self.timeout)
            except BaseException:
                hasher.close()
                os.ftruncate(fd, hasher.contiguous)  # keep only the complete prefix: the next call resumes there
                self.marker.unlink(missing_ok=True)
                raise
            hasher.close()
        finally:
            os.close(fd)
        self.marker.unlink(missing_ok=True)
        if got != e.sha256:
            self.target.unlink(missing_ok=True)
            raise WeightsIntegrityError(f"{self.model}@{self.version}/{e.path}: sha256 {got} != manifest {e.sha256}")

    def _fetch_ranges(self, fd: int, hasher: _OrderedHasher, ranges: list[tuple[int, int]]) -> None:
        if len(ranges) <= 1:
            for a, b in ranges:
                self._fetch_range(fd, hasher, a, b)
            return
        errors: list[BaseException] = []

        def worker(a: int, b: int) -> None:
            try:
                self._fetch_range(fd, hasher, a, b)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                self._abort.set()  # the other streams stop at their next chunk

        threads = [threading.Thread(target=worker, args=r, name=f"download-range-{i}") for i, r in enumerate(ranges)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _fetch_range(self, fd: int, hasher: _OrderedHasher, start: int, end: int) -> None:
        """Stream [start, end) of the file into `fd`, resuming from the last byte written on a broken stream."""
        import grpc

        e, pos = self.entry, start

        def once() -> None:
            nonlocal pos
            stream = self.source.Download(weights_pb2.DownloadRequest(
                model=self.model, version=self.version, path=e.path, offset=pos, length=end - pos,
                chunk_size=self.chunk_size), timeout=self.timeout)
            try:
                for chunk in stream:
                    if pos >= end or self._abort.is_set():
                        break  # a server that predates `length` streams on; or another range failed
                    if chunk.offset != pos:
                        raise WeightsIntegrityError(f"{e.path}: chunk at {chunk.offset}, expected {pos}")
                    if chunk.file_sha256 and chunk.file_sha256 != e.sha256:
                        raise WeightsIntegrityError(f"{e.path}: the server streams sha256 {chunk.file_sha256}, "
                                                    f"the manifest says {e.sha256}")
                    data = chunk.data
                    if len(data) > end - pos:  # a server that predates `length` streams to the end of the file
                        data = memoryview(data)[:end - pos]
                    _pwrite_all(fd, data, pos)
                    hasher.written(pos, data)
                    pos += len(data)
                if pos >= end or self._abort.is_set():
                    return
                # A stream that ends cleanly but short is the server's bytes, not the network: no retry.
                raise WeightsIntegrityError(
                    f"{self.model}@{self.version}/{e.path}: the server's stream ended at byte {pos} of "
                    f"[{start}, {end}); the file cannot match its manifest (size {e.size}, sha256 {e.sha256})")
            finally:
                stream.cancel()  # a no-op once the stream ended; frees the server when we stopped early

        # a broken stream resumes from `pos`; another range's failure (`_abort`) ends the waiting at once
        call(once, retry_on=lambda err: isinstance(err, grpc.RpcError) and not _is_permanent(err),
             what=f"download of {e.path}", attempts=self.attempts, first_s=0.2, max_s=2.0, stop=self._abort)


def _is_permanent(err: Any) -> bool:
    """Errors that another attempt cannot fix (retrying them only delays the failure)."""
    import grpc

    c = grpc.StatusCode
    return err.code() in (c.INVALID_ARGUMENT, c.NOT_FOUND, c.FAILED_PRECONDITION, c.PERMISSION_DENIED,
                          c.UNIMPLEMENTED, c.UNAUTHENTICATED)


# --- model <--> files -------------------------------------------------------------------------------
def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def save_version_files(model: Any, dest_dir: Path | str, kind: str | None = None) -> str:
    """Write a model (or a peft adapter) in the version layout; returns the kind written."""
    kind = kind or (LORA if is_lora(model) else FULL)
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    if kind == LORA:
        if not is_lora(model):
            raise ValueError("kind='lora' needs a peft model")
        model.save_pretrained(dest, safe_serialization=True)
    elif kind == FULL:
        target = model.merge_and_unload() if is_lora(model) else model
        target.save_pretrained(dest, safe_serialization=True)
    else:
        raise ValueError(f"unknown checkpoint kind {kind!r} (use 'full' or 'lora')")
    return kind


def load_version(manifest: weights_pb2.Manifest, files_dir: Path | str, base_model_name: str,
                 base_model: Any | None = None) -> Any:
    """Files of a version --> a model in eval mode. A LoRA adapter is applied to `base_model` when given
    (inference keeps one base and swaps adapters), otherwise to a fresh load of `base_model_name`."""
    import torch
    from transformers import AutoModelForCausalLM

    from shared.models import LOAD_LOCK, load_model

    files = Path(files_dir)
    model: torch.nn.Module  # a PeftModel (LoRA) or a plain causal LM (full)
    if manifest.kind == LORA:
        from peft import PeftModel

        base = base_model if base_model is not None else load_model(base_model_name)[0]
        with LOAD_LOCK:
            model = PeftModel.from_pretrained(base, files, is_trainable=False)
    elif manifest.kind in (FULL, ""):
        with LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(files, dtype=torch.float32)
    else:
        raise ValueError(f"unknown checkpoint kind {manifest.kind!r}")
    model.eval()
    return model
