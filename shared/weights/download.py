"""Downloading a version from the Weights service: parallel range streams, resumable, verified, atomic
(files written by `shared/weights/files.py`, chunks decoded by `shared/weights/wire.py`)."""

from __future__ import annotations

import itertools
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol

import grpc

from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.retry import call
from shared.security.channels import open_channel
from shared.weights.client import WeightsIntegrityError
from shared.weights.files import OrderedHasher, check_relative, fsync_dir, pwrite_all
from shared.weights.wire import decode_chunk


class DownloadSource(Protocol):
    """What `download_version` calls: a `WeightsStub`, or a `DownloadClient` (faster: see there)."""

    def Get(self, request: weights_pb2.GetVersionRequest, timeout: float | None = None) -> weights_pb2.Manifest: ...

    def Download(self, request: weights_pb2.DownloadRequest, timeout: float | None = None) -> Any: ...


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
        check_relative(entry.path)
        target = tmp / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        dirs.add(target.parent)
        fetch = _FileFetch(stub, model, manifest.version, entry, target, streams=streams, chunk_size=chunk_size,
                           timeout=timeout, attempts=attempts, durable=durable)
        fetch.run()
    if durable:
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(d)  # the files' directory entries, deepest first
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    if durable:
        fsync_dir(dest.parent)  # the rename itself
    return manifest


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
            hasher = OrderedHasher(fd, e.size, writeback=self.durable)
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

    def _fetch_ranges(self, fd: int, hasher: OrderedHasher, ranges: list[tuple[int, int]]) -> None:
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

    def _fetch_range(self, fd: int, hasher: OrderedHasher, start: int, end: int) -> None:
        """Stream [start, end) of the file into `fd`, resuming from the last byte written on a broken stream."""

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
                    pwrite_all(fd, data, pos)
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

    c = grpc.StatusCode
    return err.code() in (c.INVALID_ARGUMENT, c.NOT_FOUND, c.FAILED_PRECONDITION, c.PERMISSION_DENIED,
                          c.UNIMPLEMENTED, c.UNAUTHENTICATED)


# --- model <--> files -------------------------------------------------------------------------------
