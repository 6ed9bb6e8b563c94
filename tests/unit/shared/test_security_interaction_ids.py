"""Interaction ids bound to their tenant by a MAC: forgery, tenant swap, another secret, issue time, and the
feedback guard built on them (ownership, clock skew, per-interaction caps)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.inference.feedback_guard import FeedbackGuard, FeedbackLimits
from shared.rpc.grpc_util import InvalidRequest, PermissionDenied, ResourceExhausted
from shared.security import interaction_ids as ids

KEY = b"k" * 32


def test_an_id_verifies_only_for_its_tenant_and_secret() -> None:
    iid = ids.issue("acme", KEY)
    assert ids.is_signed(iid) and ids.verify(iid, "acme", KEY)
    assert not ids.verify(iid, "globex", KEY)              # tenant swap
    assert not ids.verify(iid, "acme", b"other" * 8)       # another deployment's secret
    assert not ids.verify(iid, "acme", b"")                # no secret: nothing verifies


def test_forgeries_fail() -> None:
    iid = ids.issue("acme", KEY)
    raw, _, tag = iid.partition(".")
    other = ids.issue("globex", KEY)
    forged = [
        raw,                                    # the tag dropped
        f"{raw}.",                              # an empty tag
        f".{tag}",                              # an empty id
        f"{raw}.{tag[:-1]}",                    # a truncated tag
        f"{raw}.{tag[:-1]}{'a' if tag[-1] != 'a' else 'b'}",   # one character changed
        f"{other.partition('.')[0]}.{tag}",     # the tag moved to another id
        f"{raw}.{other.partition('.')[2]}",     # another tenant's tag on this id
        f"{raw}.{tag}.{tag}",
        iid.upper(),
    ]
    for f in forged:
        assert not ids.verify(f, "acme", KEY), f


def test_unsigned_ids_without_a_secret() -> None:
    iid = ids.issue("acme", b"")
    assert not ids.is_signed(iid) and len(iid) == 32 and not ids.verify(iid, "acme", KEY)


def test_issued_at_reads_the_time_prefix() -> None:
    ms = 1_700_000_000_123
    iid = ids.issue("acme", KEY, raw=ids.new_raw(ms))
    assert ids.issued_at(iid) == datetime.fromtimestamp(ms / 1000, UTC)
    now = datetime.now(UTC)
    got = ids.issued_at(ids.issue("acme", KEY))
    assert got is not None and abs(got - now) < timedelta(seconds=5)
    for other in ("", "not-an-id", "z" * 32, "abc.def"):
        assert ids.issued_at(other) is None
    assert len({ids.new_raw() for _ in range(1000)}) == 1000


def _guard(**kw: float) -> FeedbackGuard:
    limits = dict(max_per_interaction=3, max_bytes_per_interaction=100, max_comment_chars=60, clock_skew_s=60.0)
    limits.update(kw)
    return FeedbackGuard(FeedbackLimits(**limits), KEY, tracked=4)  # type: ignore[arg-type]


def test_guard_ownership() -> None:
    g = _guard()
    iid = ids.issue("acme", KEY)
    g.check_owner(iid, "acme")
    with pytest.raises(PermissionDenied, match="not issued to tenant 'globex'"):
        g.check_owner(iid, "globex")
    with pytest.raises(PermissionDenied):
        g.check_owner(iid.partition(".")[0], "acme")
    FeedbackGuard(g.limits, b"").check_owner("anything", "globex")   # dev: ids unsigned, nothing to check


def test_guard_time() -> None:
    g = _guard()
    issued = datetime(2025, 1, 1, tzinfo=UTC)
    iid = ids.issue("acme", KEY, raw=ids.new_raw(int(issued.timestamp() * 1000)))
    now = issued + timedelta(hours=5)
    g.check_time(iid, issued + timedelta(hours=1), now=now)
    g.check_time(iid, issued - timedelta(seconds=30), now=now)          # within the skew
    with pytest.raises(InvalidRequest, match="before the interaction"):
        g.check_time(iid, issued - timedelta(minutes=5), now=now)
    with pytest.raises(InvalidRequest, match="in the future"):
        g.check_time(iid, now + timedelta(minutes=5), now=now)


def test_guard_caps_per_interaction() -> None:
    g = _guard()
    for _ in range(3):
        g.admit("i1", "ok")
    with pytest.raises(ResourceExhausted, match="at most 3"):
        g.admit("i1", "ok")
    g.admit("i2", "x" * 60)
    with pytest.raises(ResourceExhausted, match="100 bytes"):
        g.admit("i2", "y" * 50)
    g.admit("i2", "y" * 40)                 # a refused event does not count
    with pytest.raises(InvalidRequest, match="at most 60 characters"):
        g.admit("i3", "z" * 61)
    g.admit("i4", "é" * 30)
    with pytest.raises(ResourceExhausted):   # bytes, not characters
        g.admit("i4", "é" * 30)


def test_guard_tracking_is_bounded() -> None:
    g = _guard()
    for i in range(10):
        g.admit(f"i{i}", "a")
    assert len(g._usage) == 4


def test_a_tag_with_non_ascii_characters_is_refused_not_an_error() -> None:
    """A caller writes the id: a non-ASCII tag (the fuzzer's "0.\\x80") is a wrong tag, not a crash."""
    key = b"k" * 32
    good = ids.issue("acme", key)
    raw = good.partition(".")[0]
    for bad in ("0.\x80", f"{raw}.é", f"{raw}.\udcff", f"{raw}.{'ü' * 22}"):
        assert ids.verify(bad, "acme", key) is False
    assert ids.verify(good, "acme", key)
