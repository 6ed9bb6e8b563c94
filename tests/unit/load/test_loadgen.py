"""The load generator offline: the open loop's arrival process, that it never waits for answers, its
in-flight bound and warnings, the closed loop, the HTTP status mapping, and the documented CLI.

A `Transport` that sleeps stands in for the server here (the real one over gRPC and HTTP is in
tests/integration/test_loadgen.py).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import datetime

import pytest

from load.loadgen import LoadGenerator, arrival_gaps, build_parser, summary
from load.loadgen_transports import HTTP_CODES, Ack, Answer, Transport, base_url, make_transport


class SlowServer(Transport):
    """Answers every Generate after `delay_s` and records how many calls were in flight at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.in_flight = self.max_in_flight = self.calls = 0
        self.lock = threading.Lock()

    def generate(self, messages: list[dict[str, str]], *, tenant: str, session_id: str, task: str,
                 max_new_tokens: int, timeout: float, wait: bool) -> Answer:
        with self.lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay_s)          # the backend's latency: what the generator's pacing is measured against
        with self.lock:
            self.in_flight -= 1
        return Answer("base", [f"iid-{session_id}"], "an answer")

    def feedback(self, *, interaction_id: str, tenant: str, kind: str, value: float, kpi_name: str,
                 occurred_at: datetime, timeout: float, wait: bool) -> Ack:
        return Ack(True, f"fb-{interaction_id}")

    def close(self) -> None:
        pass


def _gen(server: SlowServer, warnings: list[str] | None = None) -> LoadGenerator:
    return LoadGenerator("unused", "support_desk", ["acme"], max_new_tokens=4, feedback_rate=0.0,
                         feedback_delay_s=0.0, seed=3, transport=server,
                         warn=(warnings.append if warnings is not None else lambda _m: None))


def test_poisson_gaps_are_exponential_and_uniform_gaps_are_constant() -> None:
    qps = 20.0
    poisson = [g for g, _ in zip(arrival_gaps(qps, "poisson", random.Random(1)), range(20_000), strict=False)]
    mean = statistics.fmean(poisson)
    assert mean == pytest.approx(1 / qps, rel=0.03)
    assert statistics.pstdev(poisson) / mean == pytest.approx(1.0, abs=0.05)     # exponential: CV = 1
    assert sum(g < mean for g in poisson) / len(poisson) == pytest.approx(1 - 1 / 2.718281828, abs=0.02)
    uniform = [g for g, _ in zip(arrival_gaps(qps, "uniform", random.Random(1)), range(100), strict=False)]
    assert set(uniform) == {1 / qps}
    with pytest.raises(ValueError, match="choose poisson or uniform"):
        next(arrival_gaps(qps, "bursty", random.Random(1)))


def test_open_loop_does_not_wait_for_answers() -> None:
    """20 req/s for 1 s against a server that takes 1.5 s per answer: about 20 arrivals, all sent within
    the second (a closed loop of 1 would have sent one)."""
    server = SlowServer(delay_s=1.5)
    gen = _gen(server)
    t0 = time.monotonic()
    stats = gen.run(duration_s=1.0, concurrency=1, qps=20.0, max_requests=1000, max_in_flight=100)
    assert stats.skipped == 0 and stats.issued == server.calls == len(stats.latencies_ms)
    assert 8 <= stats.issued <= 40                   # Poisson count of mean 20 (seeded)
    assert server.max_in_flight >= 5
    assert time.monotonic() - t0 < 1.0 + 1.5 + 1.5   # dispatch, then one answer's time to drain
    assert min(stats.latencies_ms) >= 1400
    s = summary(stats, gen.elapsed_s)
    assert s["target_qps"] == 20.0 and s["issued"] == stats.issued and s["offered_rps"] > 8


def test_in_flight_bound_skips_arrivals_and_warns_with_the_achieved_rate() -> None:
    server = SlowServer(delay_s=0.5)
    warnings: list[str] = []
    stats = _gen(server, warnings).run(duration_s=2.0, concurrency=1, qps=20.0, max_requests=1000, max_in_flight=2,
                                       arrivals="uniform")
    assert server.max_in_flight <= 2 and stats.skipped > 20
    assert stats.issued + stats.skipped == 39 or stats.issued + stats.skipped == 40
    assert any("--max-in-flight 2 calls outstanding" in w for w in warnings), warnings
    final = warnings[-1]
    assert final.startswith("target 20 req/s not reached: achieved ") and f"{stats.skipped} skipped" in final
    achieved = float(final.split("achieved ")[1].split()[0])
    assert 1.0 <= achieved <= 5.0                    # 2 in flight x 2 answers/s


def test_a_server_that_keeps_up_gets_no_warning() -> None:
    warnings: list[str] = []
    stats = _gen(SlowServer(delay_s=0.01), warnings).run(duration_s=1.0, concurrency=1, qps=10.0,
                                                         max_requests=1000, max_in_flight=50)
    assert stats.issued > 0 and stats.skipped == 0 and not warnings


def test_closed_loop_keeps_its_concurrency_and_max_requests() -> None:
    server = SlowServer(delay_s=0.05)
    stats = _gen(server).run(duration_s=5.0, concurrency=3, qps=0, max_requests=12)
    assert server.calls == len(stats.latencies_ms) == 12 and server.max_in_flight == 3
    assert stats.target_qps == 0 and "target_qps" not in summary(stats, 1.0)


def test_http_statuses_map_to_grpc_names_and_targets_to_base_urls() -> None:
    assert HTTP_CODES[400] == "INVALID_ARGUMENT" and HTTP_CODES[401] == "UNAUTHENTICATED"
    assert HTTP_CODES[429] == "RESOURCE_EXHAUSTED" and HTTP_CODES[503] == "UNAVAILABLE"
    assert base_url("127.0.0.1:8000", tls=False) == "http://127.0.0.1:8000/v1"
    assert base_url("localhost:8000", tls=True) == "https://localhost:8000/v1"
    assert base_url("https://api.example.com/v1/", tls=False) == "https://api.example.com/v1"
    with pytest.raises(ValueError, match="unknown protocol 'rest'"):
        make_transport("rest", "x", None)


def test_every_flag_is_documented_in_help() -> None:
    parser = build_parser()
    flags = {opt for a in parser._actions for opt in a.option_strings}
    assert {"--qps", "--arrivals", "--max-in-flight", "--protocol", "--concurrency", "--ca", "--api-key-file"} <= flags
    undocumented = [a.option_strings for a in parser._actions if not a.help]
    assert not undocumented
    text = parser.format_help()
    assert "Poisson" in text and "open loop" in text and "/v1/chat/completions" in text
