"""Prometheus metrics endpoint for a service (`/metrics`, ports in docs/architecture.md §2)."""

from __future__ import annotations

import logging
import math
import re
import urllib.request

from prometheus_client import start_http_server

from shared.rpc.grpc_util import PortInUse

log = logging.getLogger(__name__)


def start_metrics_server(port: int, host: str = "127.0.0.1") -> int | None:
    """Serve the default registry on `host:port` (the service's own bind address); 0 disables it.
    Returns the bound port.

    A port that is taken is fatal (PortInUse): a second process of the same service on one host would
    otherwise run without metrics, and operators would watch the first one's numbers believing they see
    both.
    """
    if port <= 0:
        return None
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as e:
        raise PortInUse(f"cannot bind the metrics port {host}:{port}: {e.strerror or e}; stop the other "
                        f"process or set the service's METRICS_PORT (0 disables metrics)") from e
    return int(server.server_port)


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
