"""Table values: the state codec round-trips and rejects foreign bytes."""

from __future__ import annotations

import pytest

from services.grader.core.state import MAX_SEEN, PendingState, decode_seq, encode_seq, seq_key


def test_roundtrip_with_and_without_blobs() -> None:
    s = PendingState("iid-1", partition=4, interaction=b"\x00\x01proto", feedback=[b"f1", b"", b"f3" * 100],
                     judge={"j": {"value": 0.5, "has_signal": True, "detail": "x"}}, revision=2, digest="abc",
                     deadline=1.5, closed=True, pending_seq=77, pending_ts=9.25)
    s.mark_seen("e1")
    assert PendingState.decode(s.encode()) == s
    empty = PendingState("iid-2")
    assert PendingState.decode(empty.encode()) == empty


def test_rejects_foreign_and_truncated_bytes() -> None:
    with pytest.raises(ValueError, match="bad magic"):
        PendingState.decode(b"{}")
    data = PendingState("x", interaction=b"1234567890").encode()
    with pytest.raises(ValueError, match="truncated"):
        PendingState.decode(data[:-3])


def test_seen_is_bounded_and_seq_codec() -> None:
    s = PendingState("x")
    for i in range(MAX_SEEN + 10):
        s.mark_seen(f"e{i}")
    assert len(s.seen) == MAX_SEEN and s.has_seen(f"e{MAX_SEEN + 9}") and not s.has_seen("e0")
    assert decode_seq(encode_seq(123)) == 123 and decode_seq(None) == 0
    assert seq_key(5) == "__confirmed__/5"
