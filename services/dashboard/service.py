"""The dashboard's handle (shared/service.py): the topic reader and the HTTP listener over the web app
(web.py)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from services.dashboard.reader import TopicReader
from services.dashboard.settings import DashboardSettings
from services.dashboard.web import Dashboard, build
from shared.rpc.grpc_util import service_host
from shared.rpc.http_listener import HttpServer
from shared.security.binding import is_loopback

log = logging.getLogger(__name__)


class DashboardServer:
    """The dashboard's handle (shared/service.py): the topic reader and the HTTP listener over a
    `Dashboard`; `port` and `url` once started. It never stops by itself (a failing reader shows on
    the health page and retries)."""

    def __init__(self, settings: DashboardSettings) -> None:
        self.settings = settings
        self.dashboard: Dashboard | None = None
        self.reader: TopicReader | None = None
        self.http: Any = None
        self.port = 0
        self.url = ""
        self._stopped = threading.Event()

    def start(self) -> None:
        s = self.settings
        host = service_host(s.host, s.common)
        try:
            self.dashboard, self.reader = build(s)
            if self.dashboard.keyring.enabled and s.common.tls_cert is None and not is_loopback(host):
                log.warning("dashboard: keys configured but no TLS certificate: operator keys would cross the "
                            "network in clear text; set APPRENTICE_TLS_CERT / APPRENTICE_TLS_KEY or bind 127.0.0.1")
            self.http = HttpServer(self.dashboard.asgi, host, s.port, s.common, name="dashboard",
                                   port_var="APPRENTICE_DASHBOARD_PORT", grace_s=s.grace_s).start()
        except BaseException:
            self.stop(grace=0)
            raise
        self.port, self.url = self.http.port, self.http.url
        print(f"apprentice dashboard: {self.url}/", flush=True)

    def wait(self, timeout: float | None = None) -> bool:
        """True once `stop()` ran."""
        return self._stopped.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Let in-flight requests finish within `grace` (default: `grace_s`), then stop the reader."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.http is not None:
            self.http.stop(self.settings.grace_s if grace is None else grace)
        if self.reader is not None:
            self.reader.stop()

    @property
    def exit_code(self) -> int:
        return 0
