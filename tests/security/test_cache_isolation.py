"""No cache a request can hit is shared across tenants: a hit answers faster than a miss, so a shared
cache tells tenant B, by latency alone, that tenant A sent the same text.

The attack this closes: a 14.5k-character message sent by tenant A and then by tenant B answered B in
57 ms instead of 211 ms, because the personal-data scan's cache (`shared/privacy/policy.py`'s `Redactor`)
was keyed by the text only. Here the real detector scans; the timing test compares medians of B-after-A
against B-cold on distinct texts of the same length (a ratio with a generous bound, never an absolute time).
"""

from __future__ import annotations

import statistics
import time
import uuid

from shared.privacy.policy import Redactor
from tests.helpers.privacy import CountingDetector


def _text(seed: str, chars: int = 14_500) -> str:
    """A long message, distinct per seed, holding personal data (so the scan does real work)."""
    base = f"Ticket {seed}: my name is Dana Whitfield, mail dana.{seed}@example.com about order {seed}. "
    return (base * (chars // len(base) + 1))[:chars]


def test_scan_cache_key_includes_the_tenant() -> None:
    text = _text("k")
    a = Redactor.cache_key(text, tenant="tenant-a")
    assert a != Redactor.cache_key(text, tenant="tenant-b")
    assert a == Redactor.cache_key(text, tenant="tenant-a")
    # length-prefixed: moving characters between tenant and text never yields the same key
    assert Redactor.cache_key("bc", tenant="a") != Redactor.cache_key("c", tenant="ab")


def test_tenant_b_is_not_served_from_tenant_a_scans() -> None:
    counting = CountingDetector()
    r = Redactor(lambda: counting)
    text = _text("x")
    r.scan(text, tenant="a")
    r.scan(text, tenant="b")
    r.scan(text, tenant="a")
    assert counting.calls[text] == 2, "tenant B's scan was answered from tenant A's (or A's own was not cached)"


def test_b_after_a_is_as_slow_as_b_cold() -> None:
    r = Redactor()
    r.warm()
    after_a, cold = [], []
    for _ in range(5):
        shared, fresh = _text(uuid.uuid4().hex[:8]), _text(uuid.uuid4().hex[:8])
        r.scan(shared, tenant="tenant-a")
        t0 = time.perf_counter()
        r.scan(shared, tenant="tenant-b")
        after_a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r.scan(fresh, tenant="tenant-b")
        cold.append(time.perf_counter() - t0)
    ratio = statistics.median(after_a) / statistics.median(cold)
    # a cache hit costs well under 1% of a scan; a miss about 100%. 0.5 leaves room for a noisy machine.
    assert ratio > 0.5, f"B after A took {ratio:.2f}x of B cold: A's scan served B"
