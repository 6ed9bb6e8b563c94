"""Fair scheduling end to end: real gRPC on loopback, the real broker, the tiny real model.

A short request from one tenant completes, within a 10 s deadline, while a long n=16 request from another
tenant is still generating (continuous batching: it joins the running batch, and the long request holds
at most its tenant's share); a tenant over its concurrency or token-rate quota gets RESOURCE_EXHAUSTED
with the time to retry, while another tenant is served.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.inference.client import InferenceClient
from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from tests.helpers.inference import start_inference

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tiny_model_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ns = Topics(prefix=f"test-fair-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, ns)
    tmp: Path = tmp_path_factory.mktemp("fair")
    a = start_inference(tmp, model=tiny_model_name, bootstrap=kafka_bootstrap, topic_prefix=ns.prefix,
                        follow_updates=False, heartbeat_interval_s=0, batch_wait_ms=0,
                        quota={"tenants": {"acme": {"max_concurrent": 1},
                                           "metered": {"tokens_per_s": 0.5, "burst_tokens": 40}}})
    yield a
    a.stop(2)
    with contextlib.suppress(Exception):
        delete_topics(kafka_bootstrap, [s.name for s in ns.specs()])


def _client(app: Any, tenant: str) -> InferenceClient:
    return InferenceClient(f"127.0.0.1:{app.port}", tenant=tenant)


def test_short_request_completes_while_a_long_one_from_another_tenant_runs(app: Any) -> None:
    with _client(app, "acme") as a, _client(app, "beta") as b:
        long = a.generate_stream("Tell me a very long story.", max_new_tokens=1500, n=16, temperature=1.0,
                                 timeout=300)
        try:
            next(long)                                             # acme's 16 rows are decoding
            t0 = time.monotonic()
            r = b.generate("hi", max_new_tokens=4, timeout=10)    # a short call of the 2-token class
            latency = time.monotonic() - t0
            assert r.choices[0].token_count > 0 and r.choices[0].finish_reason in ("length", "stop")
            finished = 0
            for _ in range(5):                                     # acme is still generating afterwards
                chunk = next(long)
                finished += bool(chunk.finish_reason)
            assert finished < 16
            assert latency < 10
            # acme is at its concurrency quota (1): one more is refused with a retry time ...
            with pytest.raises(grpc.RpcError) as e:
                a.generate("again", max_new_tokens=2, timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "acme" in e.value.details() and "retry after 1 s" in e.value.details()
            # ... while another tenant is served
            assert b.generate("and you?", max_new_tokens=2, timeout=10).choices[0].token_count > 0
        finally:
            long.cancel()


def test_token_rate_quota_refuses_with_the_time_to_retry(app: Any) -> None:
    with _client(app, "metered") as m, _client(app, "beta") as b:
        first = m.generate("hello there", max_new_tokens=8, timeout=30)   # spends the 40-token burst
        assert first.usage.total_tokens > 0
        with pytest.raises(grpc.RpcError) as e:
            m.generate("hello there", max_new_tokens=8, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = e.value.details()
        assert "token rate (0.5 tokens/s" in details and "retry after" in details
        wait = float(details.rsplit("retry after ", 1)[1].split(" s")[0])
        assert 1 <= wait <= 2 * first.usage.total_tokens / 0.5      # when the debt is repaid
        assert b.generate("hello there", max_new_tokens=8, timeout=30).choices[0].token_count > 0
