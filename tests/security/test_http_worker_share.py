"""Attack (issue #33 item 7, SECURITY.md section 4): the HTTP door ran every request's blocking steps on one
shared pool of `http_workers` threads, and a non-streamed request holds its thread for its whole
generation; a tenant allowed enough concurrency (raised quotas, or many pods' worth of traffic on one) took
every thread, and another tenant's request waited for one of those generations to end. Now each tenant may
hold `http_tenant_share` of the threads (services/inference/openai_api/routes.py `TenantLimiters`); its
excess waits in its own queue, and past `HTTP_TENANT_QUEUE` times its share it is answered 429 with
Retry-After.

Quotas are turned off here so that only the worker share stands between A and the pool: a real inference
server with the tiny model, over HTTP; B's latency is compared as a ratio of medians of the same run.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.inference import start_inference
from tests.helpers.ports import free_port

WORKERS = 4
SHARE = 0.25               # A holds one thread; three stay for everyone else
FLOOD = 8                  # A's concurrent long requests: twice the whole pool
FLOOD_TOKENS = 1500
B_REQUESTS = 5
RATIO_BOUND = 6.0


def _chat(c: httpx.Client, url: str, model: str, tenant: str, max_tokens: int, temperature: float = 0.0
          ) -> httpx.Response:
    return c.post(url, json={"model": model, "tenant": tenant, "max_tokens": max_tokens, "temperature": temperature,
                             "messages": [{"role": "user", "content": f"{tenant}: is order #2001 shipped?"}]},
                  headers={"x-apprentice-tenant": tenant})


def _b_median(url: str, model: str) -> float:
    times = []
    with httpx.Client(timeout=120) as c:
        for _ in range(B_REQUESTS):
            t0 = time.perf_counter()
            r = _chat(c, url, model, "tenant-b", 4)
            assert r.status_code == 200, r.text
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@pytest.mark.integration
def test_one_tenant_cannot_hold_every_http_worker(kafka_bootstrap: str, tiny_model_name: str,
                                                  tmp_path: Path) -> None:
    http_port = free_port()
    app = start_inference(tmp_path, model=tiny_model_name, bootstrap=kafka_bootstrap, follow_updates=False,
                          heartbeat_interval_s=0, capture=False, http_port=http_port, http_workers=WORKERS,
                          http_tenant_share=SHARE, quota={"max_concurrent": 0, "tokens_per_s": 0})
    url = f"http://127.0.0.1:{http_port}/v1/chat/completions"
    statuses: list[int] = []
    retry_after: list[str] = []
    stop = threading.Event()

    def flooder() -> None:
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                r = _chat(c, url, app.model, "tenant-a", FLOOD_TOKENS, temperature=1.0)
                statuses.append(r.status_code)
                if r.status_code == 429:
                    retry_after.append(r.headers.get("retry-after", ""))
                    stop.wait(float(r.headers.get("retry-after", "1")))

    threads = [threading.Thread(target=flooder, daemon=True) for _ in range(FLOOD)]
    try:
        _b_median(url, app.model)                        # warm-up
        idle = _b_median(url, app.model)
        for t in threads:
            t.start()
        time.sleep(2.0)                                  # A's requests hold their threads before B measures
        loaded = _b_median(url, app.model)
    finally:
        stop.set()
        app.stop(2)
        for t in threads:
            t.join(60)
    ratio = loaded / idle
    assert ratio <= RATIO_BOUND, f"B's median went from {idle:.3f} s idle to {loaded:.3f} s while A held the " \
                                 f"HTTP workers ({ratio:.1f}x > {RATIO_BOUND}x)"
    assert 429 in statuses, f"A's queue beyond its share was never refused: {sorted(set(statuses))}"
    assert all(ra.isdigit() and int(ra) >= 1 for ra in retry_after), retry_after[:5]
