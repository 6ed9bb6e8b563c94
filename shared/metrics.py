"""Prometheus metrics endpoint for a service (`/metrics`, ports in docs/architecture.md §2).

Who sees what (SECURITY.md, the /metrics row): with keys configured the endpoint binds every interface, and
some series carry a `tenant` label (which tenants exist, what each is served, how each is graded). Callers
presenting an operator, service or metrics key (`Authorization: Bearer <key>`, e.g. Prometheus'
`authorization` block with the stack's `metrics.token`, a key that can call nothing else) get the full exposition; everyone else gets the same series summed over `tenant` (totals, no tenant
names). Without keys the endpoint binds loopback only and answers only requests naming a loopback host, so a
web page cannot read it through DNS rebinding (as the dashboard, services/dashboard/web.py).
"""

from __future__ import annotations

import logging
import math
import re
import socket
import threading
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from shared.rpc.grpc_util import PortInUse
from shared.security.identity import Role
from shared.security.keys import KeyRing

log = logging.getLogger(__name__)


TENANT_LABEL = "tenant"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
FULL_VIEW = (Role.OPERATOR, Role.SERVICE, Role.METRICS)
"""Roles that see per-tenant series; a backend key acts for one tenant and must not list the others."""


class _TenantTotals:
    """The default registry with the `tenant` label summed away: what an unauthenticated scrape gets."""

    def collect(self) -> Iterable[Metric]:
        for family in REGISTRY.collect():
            if not any(TENANT_LABEL in sample.labels for sample in family.samples):
                yield family
                continue
            totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != TENANT_LABEL))
                key = (sample.name, labels)
                totals[key] = totals.get(key, 0.0) + sample.value
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [Sample(name, dict(labels), value, None, None) for (name, labels), value in totals.items()]
            yield out


def _host_name(header: str) -> str:
    """`Host` header --> host name without port (IPv6 literals keep their brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _handler(keyring: KeyRing) -> type[BaseHTTPRequestHandler]:
    totals = _TenantTotals()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                return self._send(404, b"only /metrics\n", "text/plain")
            if not keyring.enabled and _host_name(self.headers.get("host", "")) not in LOOPBACK_HOSTS:
                return self._send(403, b"this endpoint answers loopback host names only\n", "text/plain")
            full = not keyring.enabled or self._privileged()
            self._send(200, generate_latest(REGISTRY if full else totals), CONTENT_TYPE_LATEST)  # type: ignore[arg-type]

        def _privileged(self) -> bool:
            scheme, _, token = self.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return False
            identity = keyring.lookup_token(token.strip())
            return identity is not None and identity.role in FULL_VIEW

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            """Scrapes every few seconds would flood stderr; nothing to log."""

    return Handler


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _env_keyring() -> KeyRing:
    """The process's key ring from its settings (the same APPRENTICE_AUTH_KEYS[_FILE] its gRPC server reads)."""
    from shared.settings import CommonSettings

    common = CommonSettings()
    return KeyRing.from_text(common.auth_keys.get_secret_value(), file=common.auth_keys_file)


def start_metrics_server(port: int, host: str = "127.0.0.1", keyring: KeyRing | None = None) -> int | None:
    """Serve the default registry on `host:port` (the service's own bind address); 0 disables it.
    Returns the bound port. `keyring` (default: the process's settings) decides who sees per-tenant series
    (module docstring).

    A port that is taken is fatal (PortInUse): a second process of the same service on one host would
    otherwise run without metrics, and operators would watch the first one's numbers believing they see
    both.
    """
    if port <= 0:
        return None
    ring = keyring if keyring is not None else _env_keyring()
    try:
        server = (_Server6 if ":" in host else ThreadingHTTPServer)((host, port), _handler(ring))
    except OSError as e:
        raise PortInUse(f"cannot bind the metrics port {host}:{port}: {e.strerror or e}; stop the other "
                        f"process or set the service's METRICS_PORT (0 disables metrics)") from e
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return int(server.server_address[1])


_NOT_LABEL = re.compile(r"[^a-z0-9_.:-]+")


def label_value(text: str, limit: int = 64) -> str:
    """A free-text outcome --> a label value: lower case, runs of other characters (spaces included) as one
    `_`, at most `limit` characters. Label values without spaces keep PromQL matchers and dashboards
    simple; callers must still keep the set of values small (no ids or tenant names in the text)."""
    return _NOT_LABEL.sub("_", text.lower()).strip("_")[:limit] or "unknown"


MAX_EXPOSITION = 4 << 20
"""Bytes read from one /metrics endpoint (a service's exposition is tens of KiB)."""


def scrape(addr: str, timeout: float = 2.0) -> str | None:
    """The Prometheus text of `http://<addr>/metrics`; None when it does not answer, answers something that
    is not text, or more than MAX_EXPOSITION bytes (a status page must show what it can, not fail)."""

    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout) as r:
            body = r.read(MAX_EXPOSITION + 1)
        return body.decode() if len(body) <= MAX_EXPOSITION else None
    except (OSError, ValueError):    # UnicodeDecodeError is a ValueError
        return None


def metric_sum(text: str | None, name: str) -> float | None:
    """Sum of the finite samples of metric `name` (every label set) in a Prometheus text exposition; None
    when the text is missing or holds no such sample (a service that is down, or has not observed it yet).
    Lines that do not parse are skipped."""
    if not text:
        return None
    values = []
    for line in text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] != name:
            continue
        try:
            v = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if math.isfinite(v):
            values.append(v)
    return sum(values) if values else None
