"""Per-tenant quotas (services/inference/quotas.py): concurrency, the token bucket with its debt, retry
times, per-tenant overrides from settings."""

from __future__ import annotations

import threading

import grpc
import pytest

from services.inference.quotas import CONCURRENCY_RETRY_S, QuotaExceeded, QuotaLimits, TenantQuotas
from services.inference.settings import InferenceSettings
from shared.rpc.grpc_util import ResourceExhausted


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_concurrency_quota_refuses_one_more_and_a_release_frees_a_slot() -> None:
    q = TenantQuotas(QuotaLimits(max_concurrent=2))
    a, _b = q.admit("acme", 10), q.admit("acme", 10)
    with pytest.raises(QuotaExceeded) as e:
        q.admit("acme", 10)
    assert isinstance(e.value, ResourceExhausted) and e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.retry_after_s == CONCURRENCY_RETRY_S and e.value.reason == "concurrency"
    assert "2 samples in flight, 1 more would pass its quota of 2" in str(e.value) and "retry after 1 s" in str(e.value)
    q.admit("other", 10)                           # another tenant is not affected
    a.release(5)
    a.release(5)                                   # idempotent
    assert q.in_flight("acme") == 1
    q.admit("acme", 10)


def test_token_bucket_burst_rate_debt_and_retry_time() -> None:
    clock = Clock()
    q = TenantQuotas(QuotaLimits(tokens_per_s=100, burst_tokens=500), clock=clock)
    lease = q.admit("acme", 300)                   # bucket 500 -> 200
    lease.release(generated_tokens=400)            # generated tokens are charged at the end: 200 -> -200
    with pytest.raises(QuotaExceeded) as e:
        q.admit("acme", 50)                        # needs 50, has -200: 2.5 s of refill
    assert e.value.retry_after_s == pytest.approx(2.5) and e.value.reason == "tokens"
    assert "100 tokens/s" in str(e.value) and "retry after 2.5 s" in str(e.value)
    clock.t += 2.4
    with pytest.raises(QuotaExceeded):
        q.admit("acme", 50)
    clock.t += 0.1
    q.admit("acme", 50).release(0)                 # repaid exactly on time
    q.admit("beta", 500).release(0)                # each tenant has its own bucket


def test_bucket_refills_only_up_to_the_burst_and_a_huge_prompt_is_not_refused_forever() -> None:
    clock = Clock()
    q = TenantQuotas(QuotaLimits(tokens_per_s=10, burst_tokens=100), clock=clock)
    q.admit("acme", 5_000).release(0)              # larger than the burst: admitted on a full bucket
    with pytest.raises(QuotaExceeded) as e:
        q.admit("acme", 1)
    assert e.value.retry_after_s == pytest.approx(490.1)
    clock.t += 10_000                              # a long idle time refills to the burst, not beyond
    q.admit("acme", 100).release(0)
    with pytest.raises(QuotaExceeded):
        q.admit("acme", 1)


def test_default_burst_is_ten_seconds_of_rate_and_unlimited_costs_nothing() -> None:
    assert QuotaLimits(tokens_per_s=50).burst == 500
    q = TenantQuotas(QuotaLimits())
    for _ in range(1000):
        q.admit("acme", 10**6)
    assert q.in_flight("acme") == 0                # unlimited tenants are not even tracked


def test_overrides_from_settings_keep_unset_fields_at_the_pod_default() -> None:
    s = InferenceSettings.model_validate({"quota": {"max_concurrent": 4, "tokens_per_s": 1000, "tenants": {
        "acme": {"max_concurrent": 1}, "free": {"tokens_per_s": 5}}}})
    q = TenantQuotas.from_settings(s)
    assert q.limits("acme") == QuotaLimits(1, 1000, 0)
    assert q.limits("free") == QuotaLimits(4, 5, 0)
    assert q.limits("anyone") == QuotaLimits(4, 1000, 0)
    with pytest.raises(ValueError, match="quota.max_concurrent"):
        InferenceSettings.model_validate({"quota": {"max_concurrent": -1}})
    with pytest.raises(ValueError, match=r"tenant_max_concurrent=...\) is now quota.max_concurrent"):
        InferenceSettings.model_validate({"tenant_max_concurrent": 4})


def test_concurrent_admissions_never_exceed_the_quota() -> None:
    q = TenantQuotas(QuotaLimits(max_concurrent=3))
    held: list[object] = []
    refused = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            lease = q.admit("acme", 1)
        except QuotaExceeded:
            refused.append(1)
            return
        with lock:
            held.append(lease)

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 3 and len(refused) == 17
