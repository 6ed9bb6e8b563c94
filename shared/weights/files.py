"""Writing a downloaded version's files: positional writes, early write-back, hashing in file order as
the bytes land, and the fsyncs that make a download durable (used by `shared/weights/download.py`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from shared.weights.client import WeightsIntegrityError


def check_relative(path: str) -> None:
    parts = Path(path).parts
    if not path or Path(path).is_absolute() or any(p in ("..", ".") for p in parts):
        raise WeightsIntegrityError(f"manifest file path {path!r} is not a plain relative path")


def fsync_dir(path: Path) -> None:
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


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view[:WRITE_PIECE], offset)
        view = view[n:]
        offset += n


class OrderedHasher:
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
