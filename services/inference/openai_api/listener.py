"""The HTTP API's listener: uvicorn on its own thread and event loop, beside the gRPC server.

The socket is bound here, before uvicorn starts, with the gRPC server's rules: the same host
(`shared.grpc_util.service_host`: loopback without keys), never shared with another process (a taken
port raises `PortInUse`, the process exits with a clear message), HTTPS with the gRPC certificate when
`APPRENTICE_TLS_CERT/KEY` are set (and a client certificate required under
`APPRENTICE_TLS_CLIENT_AUTH`). Stopping is graceful: `begin_stop` closes the socket and lets in-flight
calls finish (streams included) while the gRPC server drains, `join` waits up to the grace period.
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


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); PortInUse when it is taken or not an address of this host."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are
    # TCP, and with Nagle on, each response waits for the client's delayed ACK (40 ms on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # restart over TIME_WAIT, never share
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise PortInUse(f"cannot bind HTTP port {host}:{port} ({e.strerror}): in use by another process or not "
                        f"an address of this host; stop the other process or set APPRENTICE_INFERENCE_HTTP_PORT "
                        f"(0 disables the HTTP API)") from None
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


class HttpListener:
    def __init__(self, asgi: Any, host: str, port: int, common: CommonSettings, grace_s: float) -> None:
        self.host = host
        self.scheme = "https" if common.tls_cert is not None else "http"
        config = uvicorn.Config(asgi, lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=math.ceil(grace_s), timeout_keep_alive=30, **tls_options(common))
        config.load()                       # TLS files and settings fail here, in the caller's thread
        self._sock = bind(host, port)
        self.port = int(self._sock.getsockname()[1])
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="http-api", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as e:  # noqa: BLE001 - reported by start(), or logged after it
            self._error = e
            log.exception("HTTP API server failed")

    def start(self) -> HttpListener:
        """Serve; returns once the listener accepts connections (raises what stopped it otherwise)."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._sock.close()
                raise RuntimeError(f"the HTTP API did not start on {self.host}:{self.port}: {self._error!r}")
            time.sleep(0.005)
        log.info("inference HTTP API listening", extra={"url": f"{self.scheme}://{self.host}:{self.port}/v1"})
        return self

    def begin_stop(self, grace: float | None = None) -> None:
        """Stop accepting connections; in-flight calls get `grace` seconds (default: the configured one)."""
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
