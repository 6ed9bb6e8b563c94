"""An ASGI app served by uvicorn on its own thread, bound by the rules every Apprentice listener follows.

The socket is bound here, before uvicorn starts, on the host the caller resolved with the gRPC servers'
rule (`shared.grpc_util.service_host`: loopback without keys), never shared with another process (a taken
port raises `PortInUse` naming the variable to change), HTTPS with the gRPC certificate when
`APPRENTICE_TLS_CERT/KEY` are set (a client certificate required under `APPRENTICE_TLS_CLIENT_AUTH`).
Stopping is graceful: `begin_stop` closes the socket and lets in-flight requests (streams included)
finish, `join` waits up to the grace period (the inference pod drains HTTP alongside gRPC this way).
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import threading
import time
from typing import Any

import uvicorn

from shared.config import CommonSettings
from shared.grpc_util import PortInUse

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0


def bind(host: str, port: int, port_var: str, backlog: int = 512) -> socket.socket:
    """A listening TCP socket on (host, port); PortInUse (naming `port_var`) when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are
    # TCP, and with Nagle on, each response waits for the client's delayed ACK (40 ms on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # restart over TIME_WAIT, never share
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise PortInUse(f"cannot bind HTTP port {host}:{port} ({e.strerror}): in use by another process or not "
                        f"an address of this host; stop the other process or set {port_var}") from None
    sock.setblocking(False)
    return sock


def tls_options(common: CommonSettings) -> dict[str, Any]:
    """uvicorn's TLS settings from the gRPC ones (no certificate: plain HTTP)."""
    if common.tls_cert is None and common.tls_key is None:
        return {}
    opts: dict[str, Any] = {"ssl_certfile": str(common.tls_cert), "ssl_keyfile": str(common.tls_key)}
    if common.tls_client_auth and common.tls_ca is not None:
        opts.update(ssl_ca_certs=str(common.tls_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    return opts


class HttpServer:
    def __init__(self, asgi: Any, host: str, port: int, common: CommonSettings, *, name: str, port_var: str,
                 grace_s: float = 5.0, backlog: int = 512, keep_alive_s: int = 5) -> None:
        """`port_var`: what to change when the port is taken (named in the error); `backlog` and
        `keep_alive_s`: a product-facing API takes bursts of connections and keeps them open longer than
        an operator page needs."""
        self.host, self.name = host, name
        self.scheme = "https" if common.tls_cert is not None else "http"
        config = uvicorn.Config(asgi, lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=math.ceil(grace_s), timeout_keep_alive=keep_alive_s,
                                **tls_options(common))
        config.load()                       # TLS files and settings fail here, in the caller's thread
        self._sock = bind(host, port, port_var, backlog)
        self.port = int(self._sock.getsockname()[1])
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"{name}-http", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as e:  # noqa: BLE001 - reported by start(), or logged after it
            self._error = e
            log.exception("%s HTTP server failed", self.name)

    def start(self) -> HttpServer:
        """Serve; returns once the listener accepts connections (raises what stopped it otherwise)."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._sock.close()
                raise RuntimeError(f"{self.name}: HTTP server did not start on {self.host}:{self.port}: "
                                   f"{self._error!r}")
            time.sleep(0.005)
        log.info("%s listening", self.name, extra={"url": self.url})
        return self

    def begin_stop(self, grace: float | None = None) -> None:
        """Stop accepting connections; in-flight requests get `grace` seconds (default: the configured one)."""
        if grace is not None:
            self._server.config.timeout_graceful_shutdown = math.ceil(grace)
        self._server.should_exit = True

    def join(self, timeout: float) -> None:
        """Wait for the drain; past `timeout`, close the remaining connections."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(2.0)

    def stop(self, grace: float = 5.0) -> None:
        self.begin_stop(grace)
        self.join(grace + 1.0)
