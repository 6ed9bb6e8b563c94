"""The download client's ordered hasher: ranges written out of order hash to the file's sha256, with
memory bounded by its window (chunks beyond it are read back from the file)."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from shared.weights.files import OrderedHasher


@pytest.mark.parametrize("window", [0, 5000, 1 << 30])
def test_out_of_order_chunks_hash_in_file_order(tmp_path: Path, window: int) -> None:
    data = random.Random(7).randbytes(100_003)
    chunks = [(off, data[off:off + 997]) for off in range(0, len(data), 997)]
    random.Random(window).shuffle(chunks)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        hasher = OrderedHasher(fd, len(data), window=window)
        for i, (off, chunk) in enumerate(chunks):
            os.pwrite(fd, chunk, off)
            hasher.written(off, chunk)
            if i == len(chunks) // 2:
                assert hasher.contiguous < len(data)
        assert hasher.digest(timeout=10) == hashlib.sha256(data).hexdigest()
        assert hasher.contiguous == len(data)
        hasher.close()
    finally:
        os.close(fd)


def test_prefix_already_on_disk_is_read_back(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    (tmp_path / "f").write_bytes(data[:4000])  # an earlier, interrupted call's bytes
    fd = os.open(tmp_path / "f", os.O_RDWR)
    try:
        hasher = OrderedHasher(fd, len(data))
        hasher.written(0, None, 4000)
        os.pwrite(fd, data[4000:], 4000)
        hasher.written(4000, data[4000:])
        assert hasher.digest(timeout=10) == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)


def test_close_stops_a_hasher_waiting_for_a_gap(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        hasher = OrderedHasher(fd, 100)
        os.pwrite(fd, b"x" * 50, 50)
        hasher.written(50, b"x" * 50)  # bytes 0..50 never arrive (a failed range)
        assert hasher.contiguous == 0
        hasher.close()  # returns: the thread gave up waiting
    finally:
        os.close(fd)


def test_writeback_is_started_behind_the_hashed_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable download asks for writeback of each hashed stretch, in file order and never ahead of
    the bytes hashed, so the final fsync has only the tail left; the real syscall accepts the call."""
    import shared.weights.files as wc

    calls: list[tuple[int, int]] = []
    real = wc.start_writeback

    def spy(fd: int, offset: int, nbytes: int) -> None:
        calls.append((offset, nbytes))
        real(fd, offset, nbytes)

    monkeypatch.setattr(wc, "WRITEBACK_STEP", 10_000)
    monkeypatch.setattr(wc, "start_writeback", spy)
    data = random.Random(3).randbytes(100_000)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        hasher = OrderedHasher(fd, len(data), writeback=True)
        for off in range(0, len(data), 4_000):
            os.pwrite(fd, data[off:off + 4_000], off)
            hasher.written(off, data[off:off + 4_000])
        assert hasher.digest(timeout=10) == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
    assert calls and calls[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(calls, calls[1:], strict=False))  # contiguous, in order
    assert all(n >= 10_000 for _, n in calls)
    assert calls[-1][0] + calls[-1][1] <= len(data)
