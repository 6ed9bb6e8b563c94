"""One tenant cannot starve another (SECURITY.md section 4, "per-tenant quotas on by default").

The attack, found from outside: over HTTP, tenant A keeps many concurrent requests (n=4, long max_tokens)
in flight; with quotas off by default they held every HTTP worker thread (services/inference/openai_api/
routes.py runs each non-streamed request on one for its whole generation) and filled the scheduler's
queue, so tenant B's latency went from 0.12 s to 21 s. With the default quotas
(services/inference/settings.py QuotaSettings, services/inference/quotas.py) A holds at most
`max_concurrent` samples; beyond it A gets 429 with Retry-After at once, and B is served near idle speed.

Only default settings here: the point is that a pod deployed as-is is fair. Latency is compared as a ratio
of medians measured in the same run, never as absolute times.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from services.inference.quotas import QuotaExceeded, TenantQuotas
from services.inference.settings import InferenceSettings
from tests.helpers.inference import start_inference
from tests.helpers.ports import free_port

FLOOD = 48                 # A's concurrent requests: more than http_workers' share a tenant should hold
FLOOD_N = 4
FLOOD_TOKENS = 256
B_REQUESTS = 7
RATIO_BOUND = 6.0          # generous: the clients share the server's interpreter (load/fairness_bench.py: 3x)


def test_quotas_are_on_by_default() -> None:
    s = InferenceSettings()
    assert s.quota.max_concurrent > 0, "per-tenant concurrency quota must be on by default"
    assert s.quota.tokens_per_s > 0, "per-tenant token-rate quota must be on by default"
    # a tenant's share of the pod stays below what the pod can hold: others keep room
    assert s.quota.max_concurrent < s.http_workers and s.quota.max_concurrent <= s.max_batch_rows


def test_default_concurrency_quota_counts_samples_not_requests() -> None:
    quotas = TenantQuotas.from_settings(InferenceSettings())
    limit = InferenceSettings().quota.max_concurrent
    leases = [quotas.admit("a", prompt_tokens=8, samples=FLOOD_N) for _ in range(limit // FLOOD_N)]
    with pytest.raises(QuotaExceeded) as e:
        quotas.admit("a", prompt_tokens=8, samples=FLOOD_N)
    assert e.value.retry_after_s > 0 and "samples in flight" in str(e.value)
    quotas.admit("b", prompt_tokens=8, samples=FLOOD_N).release()   # another tenant is untouched
    for lease in leases:
        lease.release()
    quotas.admit("a", prompt_tokens=8, samples=FLOOD_N).release()


def _chat(client: httpx.Client, url: str, model: str, tenant: str, *, n: int = 1, max_tokens: int = 4,
          temperature: float = 0.0) -> httpx.Response:
    return client.post(url, json={"model": model, "tenant": tenant, "n": n, "max_tokens": max_tokens,
                                  "temperature": temperature,
                                  "messages": [{"role": "user", "content": f"{tenant}: is order #2001 shipped?"}]})


def _b_median(url: str, model: str) -> float:
    times: list[float] = []
    with httpx.Client(timeout=120) as c:
        for _ in range(B_REQUESTS):
            t0 = time.perf_counter()
            r = _chat(c, url, model, "tenant-b")
            assert r.status_code == 200, r.text
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@pytest.mark.integration
def test_flood_from_one_tenant_leaves_another_near_idle_latency_over_http(
        kafka_bootstrap: str, tiny_model_name: str, tmp_path: Path) -> None:
    http_port = free_port()
    app = start_inference(tmp_path, model=tiny_model_name, bootstrap=kafka_bootstrap, follow_updates=False,
                          heartbeat_interval_s=0, capture=False, http_port=http_port)
    url = f"http://127.0.0.1:{http_port}/v1/chat/completions"
    statuses: list[int] = []
    retry_after: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def flooder() -> None:
        with httpx.Client(timeout=300) as c:
            while not stop.is_set():
                r = _chat(c, url, app.model, "tenant-a", n=FLOOD_N, max_tokens=FLOOD_TOKENS, temperature=1.0)
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 429:
                        retry_after.append(r.headers.get("retry-after", ""))
                if r.status_code == 429:    # waits as told: measures the server's fairness, not this
                    stop.wait(float(r.headers.get("retry-after", "1")))   # process's GIL under a spin

    try:
        _b_median(url, app.model)                    # warm-up: first forward passes, tokenizer caches
        idle = _b_median(url, app.model)
        threads = [threading.Thread(target=flooder, daemon=True) for _ in range(FLOOD)]
        for t in threads:
            t.start()
        time.sleep(2.0)                              # A's requests are in flight before B measures
        loaded = _b_median(url, app.model)
        stop.set()
        for t in threads:
            t.join(300)
    finally:
        stop.set()
        app.stop(2)
    ratio = loaded / idle
    assert ratio <= RATIO_BOUND, f"B's median went from {idle:.3f} s idle to {loaded:.3f} s under A's flood " \
                                 f"({ratio:.1f}x > {RATIO_BOUND}x)"
    assert 429 in statuses, f"A was never refused beyond its quota: {sorted(set(statuses))}"
    assert all(ra.isdigit() and int(ra) >= 1 for ra in retry_after), retry_after[:5]
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
