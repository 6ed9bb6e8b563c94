"""The scraper's key (SECURITY.md, the /metrics row): the shipped Prometheus configurations scraped with no key,
so they saw only series summed over tenants, and the one key that would have shown the per-tenant series (the
services') also opens every service RPC. Now a key of role `metrics` sees the full exposition
(tests/security/test_metrics_tenants.py), calls no RPC (tests/security/test_auth.py) and no HTTP API (here),
and the compose configuration presents it, mounting that key alone (the Helm ServiceMonitor:
tests/deploy/test_helm.py::test_the_service_monitor_presents_the_metrics_key)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from services.inference.openai_api.auth import FEEDBACK, GENERATE, authenticate
from shared.rpc.grpc_util import PermissionDenied
from shared.security.identity import Role
from shared.security.keys import KeyRing
from tools.devca import ensure_dev_credentials

REPO = Path(__file__).resolve().parents[2]


def test_a_metrics_key_is_refused_by_the_http_api() -> None:
    ring = KeyRing.from_text("metrics:prom=k" + "x" * 40)
    assert ring.lookup_token("k" + "x" * 40).role is Role.METRICS   # type: ignore[union-attr]
    for method in (GENERATE, FEEDBACK):
        with pytest.raises(PermissionDenied, match="metrics key 'prom' may not call"):
            authenticate(ring, "Bearer k" + "x" * 40, method)


def test_the_local_stack_writes_a_scrape_key_a_scraper_can_mount_alone(tmp_path: Path) -> None:
    creds = ensure_dev_credentials(tmp_path, ("demo",))
    token = creds.metrics_token
    assert token.parent.name == "scrape" and token.parent.parent == creds.directory
    assert stat.S_IMODE(token.stat().st_mode) == 0o644 and stat.S_IMODE(token.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(creds.directory.stat().st_mode) == 0o700       # private on the host all the same
    assert sorted(p.name for p in token.parent.iterdir()) == ["metrics.token"]
    ring = KeyRing.from_text(creds.keys_file.read_text(), file=None)
    assert ring.lookup_token(creds.token(token)).role is Role.METRICS  # type: ignore[union-attr]


def test_compose_prometheus_presents_the_metrics_key_on_every_service_job() -> None:
    conf = yaml.safe_load((REPO / "compose/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    for name in ("inference", "grader", "extractor", "trainer", "weights"):
        assert jobs[name]["authorization"] == {"credentials_file": "/etc/prometheus/scrape/metrics.token"}, name
    compose = yaml.safe_load((REPO / "compose/docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    secret_mounts = [m for m in mounts if isinstance(m, dict) and m.get("source") == "secrets"]
    assert secret_mounts == [{"type": "volume", "source": "secrets", "target": "/etc/prometheus/scrape",
                              "read_only": True, "volume": {"subpath": "scrape"}}]
    assert not any(isinstance(m, str) and m.startswith("secrets:") for m in mounts)

