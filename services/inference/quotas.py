"""A tenant's request --> admitted (a lease to release when it ends) or RESOURCE_EXHAUSTED with a retry time.

Two per-tenant quotas, per pod, from settings (`APPRENTICE_INFERENCE_TENANT_*`, with per-tenant overrides):
1. Concurrency: at most `max_concurrent` requests in flight (queued + generating).
2. Token rate: a token bucket of prompt + generated tokens, refilled at `tokens_per_s` up to `burst_tokens`.
   Prompt tokens are charged at admission, generated tokens when the request ends (they are not known
   before), so the bucket may go negative: a tenant in debt waits until the refill has repaid it. Admission
   needs min(prompt tokens, burst) in the bucket, so a prompt larger than the burst is not refused forever.
   Over time a tenant gets `tokens_per_s`; at once, the burst plus what its requests in flight generate.

Refusals raise `QuotaExceeded` (a `ResourceExhausted`: gRPC RESOURCE_EXHAUSTED, HTTP 429) whose message and
`retry_after_s` say when a retry can succeed. No network, no torch; the clock is injectable for tests.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.rpc.grpc_util import ResourceExhausted

if TYPE_CHECKING:
    from services.inference.settings import InferenceSettings

CONCURRENCY_RETRY_S = 1.0
"""Suggested wait after a concurrency refusal: a slot frees when one of the tenant's requests ends, which
this module cannot predict; one second is short next to a generation and long next to a retry storm."""


class QuotaExceeded(ResourceExhausted):
    """A tenant quota refused the request; retrying after `retry_after_s` seconds can succeed."""

    def __init__(self, message: str, retry_after_s: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason          # concurrency | tokens (metric label)


@dataclass(frozen=True)
class QuotaLimits:
    max_concurrent: int = 0         # requests in flight; 0 = unlimited
    tokens_per_s: float = 0.0       # bucket refill rate; 0 = unlimited
    burst_tokens: int = 0           # bucket size; 0 = 10 seconds of `tokens_per_s`

    @property
    def burst(self) -> float:
        return float(self.burst_tokens) if self.burst_tokens > 0 else 10.0 * self.tokens_per_s

    @property
    def unlimited(self) -> bool:
        return self.max_concurrent <= 0 and self.tokens_per_s <= 0


class _Bucket:
    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.level, self.at = burst, now

    def refill(self, now: float) -> float:
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        return self.level


@dataclass
class _TenantState:
    in_flight: int = 0
    bucket: _Bucket | None = None


class Lease:
    """One admitted request; `release(generated_tokens)` when it ends (idempotent, thread-safe)."""

    def __init__(self, owner: TenantQuotas | None, tenant: str, samples: int = 1) -> None:
        self._owner, self.tenant, self.samples = owner, tenant, samples
        self._released = False

    def release(self, generated_tokens: int = 0) -> None:
        owner = self._owner
        if owner is None:
            return
        with owner._lock:
            if self._released:
                return
            self._released = True
            owner._end(self.tenant, self.samples, generated_tokens)


class TenantQuotas:
    """Per-tenant concurrency and token-rate quotas of one pod."""

    def __init__(self, default: QuotaLimits, overrides: Mapping[str, QuotaLimits] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.default = default
        self.overrides = dict(overrides or {})
        self.clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantState] = {}

    @classmethod
    def from_settings(cls, settings: InferenceSettings) -> TenantQuotas:
        """Pod defaults from `APPRENTICE_INFERENCE_QUOTA__*`, overrides from `..._QUOTA__TENANTS`."""
        quota = settings.quota
        default = QuotaLimits(quota.max_concurrent, quota.tokens_per_s, quota.burst_tokens)
        overrides = {
            tenant: QuotaLimits(
                default.max_concurrent if q.max_concurrent is None else q.max_concurrent,
                default.tokens_per_s if q.tokens_per_s is None else q.tokens_per_s,
                default.burst_tokens if q.burst_tokens is None else q.burst_tokens)
            for tenant, q in quota.tenants.items()}
        return cls(default, overrides)

    def limits(self, tenant: str) -> QuotaLimits:
        return self.overrides.get(tenant, self.default)

    def admit(self, tenant: str, prompt_tokens: int, samples: int = 1) -> Lease:
        """Admit one request of `tenant` with `samples` samples (its `n`) or raise `QuotaExceeded`; charges
        the prompt tokens. Concurrency counts samples, not requests: each sample is a row of the batch, so
        a request of n=4 costs the other tenants what four requests of n=1 cost."""
        samples = max(1, samples)
        lim = self.limits(tenant)
        if lim.unlimited:
            return Lease(None, tenant)
        with self._lock:
            st = self._tenants.setdefault(tenant, _TenantState())
            if lim.max_concurrent > 0 and st.in_flight > 0 and st.in_flight + samples > lim.max_concurrent:
                raise QuotaExceeded(
                    f"tenant {tenant!r} already has {st.in_flight} samples in flight, {samples} more would pass "
                    f"its quota of {lim.max_concurrent}; "
                    f"retry after {CONCURRENCY_RETRY_S:g} s", CONCURRENCY_RETRY_S, "concurrency")
            if lim.tokens_per_s > 0:
                now = self.clock()
                if st.bucket is None:
                    st.bucket = _Bucket(lim.tokens_per_s, lim.burst, now)
                level = st.bucket.refill(now)
                need = min(float(prompt_tokens), st.bucket.burst)
                if level < need:
                    wait = math.ceil((need - level) / lim.tokens_per_s * 10) / 10     # round up to 0.1 s
                    raise QuotaExceeded(
                        f"tenant {tenant!r} is over its token rate ({lim.tokens_per_s:g} tokens/s, burst "
                        f"{st.bucket.burst:g}); retry after {wait:g} s", wait, "tokens")
                st.bucket.level -= prompt_tokens
            st.in_flight += samples
        return Lease(self, tenant, samples)

    def _end(self, tenant: str, samples: int, generated_tokens: int) -> None:
        """Caller holds _lock."""
        st = self._tenants[tenant]
        st.in_flight -= samples
        if st.bucket is not None:
            st.bucket.refill(self.clock())
            st.bucket.level -= generated_tokens
        if st.in_flight == 0 and (st.bucket is None or st.bucket.level >= st.bucket.burst):
            del self._tenants[tenant]            # nothing to remember: a full bucket is the default state

    def in_flight(self, tenant: str) -> int:
        with self._lock:
            st = self._tenants.get(tenant)
            return 0 if st is None else st.in_flight
