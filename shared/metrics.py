"""Prometheus metrics endpoint for a service (`/metrics`, ports in DESIGN.md section 2)."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

log = logging.getLogger(__name__)


def start_metrics_server(port: int, host: str = "0.0.0.0") -> int | None:
    """Serve the default registry on `port`; 0 disables the endpoint. Returns the bound port.

    A port already in use is logged, not fatal: metrics must never stop a service from serving.
    """
    if port <= 0:
        return None
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as e:
        log.error("metrics endpoint not started on :%d: %s", port, e)
        return None
    return int(server.server_port)
