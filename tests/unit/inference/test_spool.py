"""The capture spool on a real directory: order, acknowledgement, rotation, recovery, bounds, locking."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.inference.spool import Spool, SpoolLocked


def _drain(s: Spool) -> list[int]:
    out = []
    while (r := s.next_record()) is not None:
        out.append(r.seq)
    return out


def test_records_come_back_in_order_and_leave_when_acked(tmp_path: Path) -> None:
    s = Spool(tmp_path, segment_bytes=200)
    seqs = [s.append("topic", f"k{i}".encode(), b"x" * 50) for i in range(10)]
    s.flush()
    assert seqs == list(range(1, 11))
    recs = []
    while (r := s.next_record()) is not None:
        recs.append(r)
    assert [r.seq for r in recs] == seqs and recs[3].key == b"k3" and recs[3].topic == "topic"
    assert len(list(tmp_path.glob("*.seg"))) > 2                      # rotated
    for q in (2, 1, 3):                                                # out-of-order acks
        s.ack(q)
    assert s.cursor == 3 and s.depth == 7
    for q in range(4, 11):
        s.ack(q)
    assert s.depth == 0 and len(list(tmp_path.glob("*.seg"))) == 1   # delivered segments deleted
    s.close()


def test_reopen_replays_only_unacked_in_order(tmp_path: Path) -> None:
    s = Spool(tmp_path, segment_bytes=120, cursor_interval_s=0)
    for i in range(6):
        s.append("t", b"k", f"v{i}".encode())
    s.flush()
    _drain(s)
    s.ack(1)
    s.ack(2)
    s.ack(4)                        # 3 not acked: the cursor stays at 2
    s.close()
    s2 = Spool(tmp_path)
    assert _drain(s2) == [3, 4, 5, 6]                                  # 4 re-sent after a restart (dedupe by id)
    assert s2.append("t", b"k", b"new") == 7
    s2.close()


def test_reopen_after_everything_was_acked(tmp_path: Path) -> None:
    """A restart with fully delivered segments on disk drops them on open (this once crashed the service)."""
    s = Spool(tmp_path, segment_bytes=60, cursor_interval_s=0)
    for i in range(4):
        s.append("t", b"k", f"v{i}".encode() * 8)
    s.flush()
    for q in _drain(s):
        s.ack(q)
    s.close()
    s2 = Spool(tmp_path)
    assert _drain(s2) == [] and s2.depth == 0
    assert s2.append("t", b"k", b"new") == 5
    s2.flush()
    assert _drain(s2) == [5]
    s2.close()


def test_rewind_resends_failed_but_not_acked_records(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    for _ in range(5):
        s.append("t", b"k", b"v")
    s.flush()
    assert _drain(s) == [1, 2, 3, 4, 5]
    s.ack(1)
    s.ack(3)
    s.rewind()
    assert _drain(s) == [2, 4, 5]
    s.close()


def test_torn_tail_is_cut_on_open(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    for i in range(3):
        s.append("t", b"k", f"v{i}".encode())
    s.close()
    seg = sorted(tmp_path.glob("*.seg"))[0]
    data = seg.read_bytes()
    seg.write_bytes(data[:-3])                                          # a crash mid-write
    s2 = Spool(tmp_path)
    recs = []
    while (r := s2.next_record()) is not None:
        recs.append(r)
    assert [r.value for r in recs] == [b"v0", b"v1"]
    assert s2.append("t", b"k", b"v2") == 3
    s2.close()


def test_full_spool_refuses_instead_of_growing(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=300, segment_bytes=300)
    results = [s.append("t", b"k", b"x" * 60) for _ in range(10)]
    assert None in results and results[0] == 1
    assert s.bytes <= 300
    accepted = [r for r in results if r is not None]
    s.flush()
    for q in accepted:
        s.next_record()
        s.ack(q)
    assert s.depth == 0
    assert s.append("t", b"k", b"x" * 60) is not None                 # delivered bytes are reclaimed
    s.close()


def test_one_process_per_spool(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    with pytest.raises(SpoolLocked, match="POD_ID"):
        Spool(tmp_path)
    s.close()
    Spool(tmp_path).close()
