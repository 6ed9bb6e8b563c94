"""Capture events --> an append-only, bounded on-disk log --> read back in order --> deleted once acked.

The spool is the capture path's write-ahead log: every event is appended here first, the sender reads
it in order and hands records to Kafka, and a record leaves the spool only when Kafka acknowledged it.
So a broker outage (or a crash) loses nothing, replays in the original order, and never produces a
record that was already acknowledged in this process. After a crash, records acknowledged since the
last cursor save (at most `cursor_interval_s` worth) are sent again: consumers dedupe by event id.

Layout: `<dir>/<first_seq:020d>.seg` files of records, a `cursor` file (highest seq with every record
up to it acknowledged) and a `lock` file (one process per spool). Record:
`crc32 (4) | payload length (4) | seq (8) | topic length (2) | topic | key length (4) | key | value`,
the CRC covering everything after itself; a torn tail (crash mid-write) is cut off on open.
The spool holds captured events (prompts and answers) in the clear: the directory is 0700 and
every file 0600 whatever the process umask, and a spool an older version left readable is tightened on
open (SECURITY.md, personal data).
No network and no threads here: the capture worker owns the only instance.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

log = logging.getLogger(__name__)

DIR_MODE, FILE_MODE = 0o700, 0o600
"""Only the service's own account may list the spool or read what it captured."""


def _private_open(path: Path, mode: str) -> BinaryIO:
    """`open(path, mode)` (binary) creating the file 0600; fchmod as well, since the umask only removes
    bits and an existing file keeps the mode it was created with."""
    flags = {"ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}[mode]
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return cast(BinaryIO, os.fdopen(fd, mode))
    except BaseException:
        os.close(fd)
        raise


def make_private(directory: Path) -> None:
    """Create `directory` if needed and tighten it and every file in it to the service alone."""
    directory.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(directory, DIR_MODE)
    for f in directory.iterdir():
        if f.is_file() and not f.is_symlink():
            os.chmod(f, FILE_MODE)

_HEAD = struct.Struct(">IIQ")       # crc, payload length, seq
_TOPIC = struct.Struct(">H")
_KEY = struct.Struct(">I")


class SpoolLocked(RuntimeError):
    """Another process uses this spool directory: give each replica its own (APPRENTICE_INFERENCE_POD_ID)."""


@dataclass(frozen=True)
class SpoolRecord:
    seq: int
    topic: str
    key: bytes
    value: bytes


@dataclass
class _Segment:
    first_seq: int
    path: Path
    last_seq: int          # first_seq - 1 while empty
    size: int


def _encode(seq: int, topic: str, key: bytes, value: bytes) -> bytes:
    t = topic.encode()
    body = struct.pack(">Q", seq) + _TOPIC.pack(len(t)) + t + _KEY.pack(len(key)) + key + value
    payload = body[8:]
    return _HEAD.pack(zlib.crc32(body), len(payload), seq) + payload


def _read_record(f: BinaryIO) -> SpoolRecord | None:
    """The next whole, intact record at f's position, or None (end of data or a torn/corrupt tail)."""
    head = f.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    crc, n, seq = _HEAD.unpack(head)
    payload = f.read(n)
    if len(payload) < n or zlib.crc32(struct.pack(">Q", seq) + payload) != crc:
        return None
    (tl,) = _TOPIC.unpack_from(payload, 0)
    topic = payload[2:2 + tl].decode()
    (kl,) = _KEY.unpack_from(payload, 2 + tl)
    k0 = 2 + tl + 4
    return SpoolRecord(seq, topic, payload[k0:k0 + kl], payload[k0 + kl:])


class Spool:
    def __init__(self, directory: Path | str, *, max_bytes: int = 512 << 20, segment_bytes: int = 4 << 20,
                 cursor_interval_s: float = 0.2) -> None:
        self.dir = Path(directory)
        make_private(self.dir)
        self.max_bytes, self.segment_bytes, self.cursor_interval_s = max_bytes, segment_bytes, cursor_interval_s
        self._lock_f = _private_open(self.dir / "lock", "wb")   # held for the spool's lifetime
        try:
            fcntl.flock(self._lock_f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_f.close()
            raise SpoolLocked(f"spool {self.dir} is in use by another process; give each inference replica "
                              "its own APPRENTICE_INFERENCE_POD_ID or APPRENTICE_INFERENCE_SPOOL_DIR") from None
        self.cursor = self._read_cursor()
        self._acked: set[int] = set()              # acknowledged out of order, > cursor
        self._cursor_saved_at = 0.0
        self._segments = self._recover()
        last = self._segments[-1].last_seq if self._segments else self.cursor
        self.next_seq = max(last, self.cursor) + 1
        # always write into a fresh segment: never append behind a tail that recovery had to cut
        self._writer: BinaryIO | None = None
        self._open_segment()
        self._reader_idx = 0                       # before _drop_acked_segments, which moves the reader
        self._reader: BinaryIO | None = None
        self._drop_acked_segments()
        self.rewind()

    # --- recovery ---------------------------------------------------------------------------------
    def _read_cursor(self) -> int:
        try:
            return int((self.dir / "cursor").read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _recover(self) -> list[_Segment]:
        segs = []
        for path in sorted(self.dir.glob("*.seg")):
            first = int(path.stem)
            last, good = first - 1, 0
            with open(path, "rb") as f:
                while (rec := _read_record(f)) is not None:
                    last, good = rec.seq, f.tell()
            size = path.stat().st_size
            if good < size:
                log.warning("spool: cut a torn tail", extra={"segment": path.name, "bytes": size - good})
                with open(path, "r+b") as f:
                    f.truncate(good)
            if good == 0:
                path.unlink()
                continue
            segs.append(_Segment(first, path, last, good))
        return segs

    # --- writing ----------------------------------------------------------------------------------
    def _open_segment(self) -> None:
        if self._writer is not None:
            self._writer.close()
        path = self.dir / f"{self.next_seq:020d}.seg"
        self._writer = _private_open(path, "ab")   # closed on rotation / close()
        self._segments.append(_Segment(self.next_seq, path, self.next_seq - 1, 0))

    def append(self, topic: str, key: bytes, value: bytes) -> int | None:
        """Append one event; returns its sequence number, or None when the spool is full (the caller
        raises the alarm; the request that produced the event is not affected)."""
        rec = _encode(self.next_seq, topic, key, value)
        if self.bytes + len(rec) > self.max_bytes:
            active = self._segments[-1]
            if active.size and active.last_seq <= self.cursor:   # everything delivered: reclaim its space
                self._open_segment()
                self._drop_acked_segments()
            if self.bytes + len(rec) > self.max_bytes:
                return None
        active = self._segments[-1]
        if active.size and active.size + len(rec) > self.segment_bytes:
            self._open_segment()
            active = self._segments[-1]
        assert self._writer is not None, "spool is closed"
        self._writer.write(rec)
        active.size += len(rec)
        active.last_seq = self.next_seq
        self.next_seq += 1
        return active.last_seq

    def flush(self) -> None:
        """Hand appended bytes to the OS (readable by the sender; survives a process crash)."""
        if self._writer is not None:
            self._writer.flush()

    # --- reading ----------------------------------------------------------------------------------
    def rewind(self) -> None:
        """Read again from the oldest unacknowledged record (after failed deliveries)."""
        self.flush()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._reader_idx = 0
        while self._reader_idx < len(self._segments) - 1 and self._segments[self._reader_idx].last_seq <= self.cursor:
            self._reader_idx += 1

    def next_record(self) -> SpoolRecord | None:
        """The next unacknowledged record after the last one returned, or None when caught up."""
        while self._reader_idx < len(self._segments):
            seg = self._segments[self._reader_idx]
            if self._reader is None:
                self._reader = open(seg.path, "rb")  # noqa: SIM115 - closed when the segment is done
            pos = self._reader.tell()
            rec = _read_record(self._reader)
            if rec is None:
                self._reader.seek(pos)
                if self._reader_idx == len(self._segments) - 1:
                    return None               # caught up with the writer
                self._reader.close()
                self._reader = None
                self._reader_idx += 1
                continue
            if rec.seq <= self.cursor or rec.seq in self._acked:
                continue
            return rec
        return None

    # --- acknowledgements -------------------------------------------------------------------------
    def ack(self, seq: int) -> None:
        """Kafka acknowledged `seq`: advance the cursor over every contiguously acknowledged record and
        delete segments that hold nothing unacknowledged any more."""
        if seq <= self.cursor:
            return
        self._acked.add(seq)
        moved = False
        while self.cursor + 1 in self._acked:
            self.cursor += 1
            self._acked.discard(self.cursor)
            moved = True
        if moved:
            self._drop_acked_segments()
            if time.monotonic() - self._cursor_saved_at >= self.cursor_interval_s:
                self._save_cursor()

    def _drop_acked_segments(self) -> None:
        # never the active (last) segment; segments are in seq order
        while len(self._segments) > 1 and self._segments[0].last_seq <= self.cursor:
            seg = self._segments.pop(0)
            if self._reader_idx > 0:
                self._reader_idx -= 1
            elif self._reader is not None:
                self._reader.close()
                self._reader = None
            seg.path.unlink(missing_ok=True)

    def _save_cursor(self) -> None:
        tmp = self.dir / "cursor.tmp"
        with _private_open(tmp, "wb") as f:
            f.write(str(self.cursor).encode())
        os.replace(tmp, self.dir / "cursor")
        self._cursor_saved_at = time.monotonic()

    # --- state ------------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Records appended and not yet acknowledged."""
        return self.next_seq - 1 - self.cursor - len(self._acked)

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def close(self) -> None:
        self.flush()
        self._save_cursor()
        for f in (self._writer, self._reader):
            if f is not None:
                f.close()
        self._writer = self._reader = None
        fcntl.flock(self._lock_f, fcntl.LOCK_UN)
        self._lock_f.close()
