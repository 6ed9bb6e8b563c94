"""Attack (issue #33 item 8, SECURITY.md /metrics row): with keys configured every service's /metrics binds all
interfaces and answered anyone with per-tenant series (`apprentice_inference_served_version{tenant=...}`,
the grader's per-tenant rewards): which customers exist and what each is served, to any host that reaches
the port. Now an unauthenticated scrape gets the same series summed over `tenant`; operator and service keys
(Prometheus' bearer credentials) get the full exposition; a backend key (one tenant) gets the totals. Without
keys the endpoint is loopback-only and refuses requests naming another host (DNS rebinding).

A real metrics server (shared/metrics.py) on a real socket, scraped over HTTP."""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request

from services.inference.metrics import SERVED_VERSION
from shared.metrics import start_metrics_server
from shared.security.keys import KeyRing
from tests.helpers.ports import free_port
from tests.security.harness import non_loopback_ip

HIDDEN = f"tenant-{secrets.token_hex(4)}"
KEYS = {role: secrets.token_urlsafe(32) for role in ("operator", "service", "metrics", "backend")}


def _ring() -> KeyRing:
    return KeyRing.from_text(f"operator:ops={KEYS['operator']},service:svc={KEYS['service']},"
                             f"metrics:prom={KEYS['metrics']},"
                             f"backend:shop@{HIDDEN}={KEYS['backend']}")


def _scrape(addr: str, port: int, *, token: str = "", host: str = "") -> tuple[int, str]:
    req = urllib.request.Request(f"http://{addr}:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_anonymous_scrape_sees_no_tenant_names() -> None:
    SERVED_VERSION.labels(tenant=HIDDEN, version="v7", role="stable").set(1)
    port = start_metrics_server(free_port(), "0.0.0.0", _ring())
    assert port is not None
    addr = non_loopback_ip() or "127.0.0.1"
    status, anonymous = _scrape(addr, port, host="metrics.example.org")
    assert status == 200
    assert "apprentice_inference_served_version" in anonymous     # the totals are still there
    assert HIDDEN not in anonymous and "tenant=" not in anonymous
    for role in ("operator", "service", "metrics"):
        status, full = _scrape(addr, port, token=KEYS[role], host="metrics.example.org")
        assert status == 200 and f'tenant="{HIDDEN}"' in full, role
    _, backend = _scrape(addr, port, token=KEYS["backend"])
    assert HIDDEN not in backend
    _, wrong = _scrape(addr, port, token="not-a-key-" + secrets.token_hex(8))
    assert HIDDEN not in wrong


def test_without_keys_only_loopback_host_names_are_answered() -> None:
    port = start_metrics_server(free_port(), "127.0.0.1", KeyRing.from_text(""))
    assert port is not None
    assert _scrape("127.0.0.1", port)[0] == 200
    assert _scrape("127.0.0.1", port, host=f"localhost:{port}")[0] == 200
    assert _scrape("127.0.0.1", port, host="rebound.example.org")[0] == 403
