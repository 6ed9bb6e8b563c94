"""An ASGI app served by uvicorn on its own thread, bound by the rules every Apprentice listener follows.

The socket is bound here, before uvicorn starts, on the host the caller resolved with the gRPC servers'
rule (`shared.rpc.grpc_util.service_host`: loopback without keys), never shared with another process (a taken
port raises `PortInUse` naming the variable to change), HTTPS with the gRPC certificate when
`APPRENTICE_TLS_CERT/KEY` are set (a client certificate required under `APPRENTICE_TLS_CLIENT_AUTH`).
Stopping is graceful: `begin_stop` closes the socket and lets in-flight requests (streams included)
finish, `join` waits up to the grace period (the inference pod drains HTTP alongside gRPC this way).

An HTTPS port answers a plaintext request (`curl http://...`) with one line of plain HTTP naming the
https:// URL and how to trust the stack's CA (`PlainOrTls`): with TLS on by default, the usual first
mistake otherwise ends in an opaque reset or "Connection error." on the client's side.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import math
import re
import socket
import ssl
import threading
import time
from typing import Any

import uvicorn

from shared.rpc.grpc_util import PortInUse
from shared.settings import CommonSettings

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0
TLS_HANDSHAKE = 0x16
"""The first byte of every TLS connection (a handshake record carrying the ClientHello)."""
FIRST_BYTES_TIMEOUT_S = 60.0
"""How long a new connection may stay silent (asyncio's own TLS handshake timeout)."""
PLAIN_REPLY_LINGER_S = 5.0
"""How long the refused plaintext request may take to finish sending before the connection is closed."""
TRUST_HINT = 'eval "$(apprentice env)"'
_HOST = re.compile(rb"\r\nhost:[ \t]*([A-Za-z0-9.:\[\]-]{1,255})[ \t]*\r\n", re.I)


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


def plaintext_reply(first_bytes: bytes, default_host: str, path: str) -> bytes:
    """The whole answer to a plaintext HTTP request on an HTTPS port: 400 and one line naming the https:// URL
    (the request's own Host, else the listener's address) and the command that makes clients trust the CA."""
    m = _HOST.search(first_bytes)
    host = m.group(1).decode() if m else default_host
    body = (f"this port speaks HTTPS: use https://{host}{path} and trust the stack's CA "
            f"({TRUST_HINT})\n").encode()
    head = (f"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


class PlainOrTls(asyncio.Protocol):
    """A connection's first protocol on an HTTPS port: looks at the first bytes before any TLS. A TLS
    handshake (0x16) goes on as asyncio's own TLS server would (the same `SSLProtocol`, fed the bytes already
    read, around uvicorn's protocol); anything else gets `plaintext_reply` and is closed once the client has
    read it (half-close, then a short linger, so the answer is not lost to a reset)."""

    def __init__(self, make_app: Any, ssl_context: ssl.SSLContext, default_host: str, path: str) -> None:
        self._make_app, self._ctx, self._default_host, self._path = make_app, ssl_context, default_host, path
        self._transport: asyncio.Transport | None = None
        self._plain = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(FIRST_BYTES_TIMEOUT_S, transport.close)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if self._plain or transport is None or not data:
            return                                   # the rest of a refused request: dropped
        if self._timer is not None:
            self._timer.cancel()
        if data[0] == TLS_HANDSHAKE:
            loop = asyncio.get_running_loop()
            handshake: asyncio.Future[None] = loop.create_future()   # a failed handshake is logged by asyncio
            handshake.add_done_callback(lambda f: f.cancelled() or f.exception())
            tls = asyncio.sslproto.SSLProtocol(loop, self._make_app(), self._ctx, handshake, server_side=True)
            transport.set_protocol(tls)
            tls.connection_made(transport)
            view = memoryview(data)
            while view:
                buf = tls.get_buffer(len(view))
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                tls.buffer_updated(n)
                view = view[n:]
            return
        self._plain = True
        transport.write(plaintext_reply(data, self._default_host, self._path))
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(PLAIN_REPLY_LINGER_S, transport.close)

    def eof_received(self) -> bool | None:
        return False                                 # close (after the reply is flushed)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None


class HttpServer:
    def __init__(self, asgi: Any, host: str, port: int, common: CommonSettings, *, name: str, port_var: str,
                 grace_s: float = 5.0, backlog: int = 512, keep_alive_s: int = 5, https_path: str = "/") -> None:
        """`port_var`: what to change when the port is taken (named in the error); `backlog` and
        `keep_alive_s`: a product-facing API takes bursts of connections and keeps them open longer than
        an operator page needs; `https_path`: the path a plaintext request is told to use with https://
        (the OpenAI API's base URL ends in /v1)."""
        self.host, self.name = host, name
        self.scheme = "https" if common.tls_cert is not None else "http"
        config = uvicorn.Config(asgi, lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=math.ceil(grace_s), timeout_keep_alive=keep_alive_s,
                                **tls_options(common))
        config.load()                       # TLS files and settings fail here, in the caller's thread
        self._sock = bind(host, port, port_var, backlog)
        self.port = int(self._sock.getsockname()[1])
        if config.ssl is not None:
            # uvicorn serves plain TCP; each connection starts in PlainOrTls, which wraps uvicorn's protocol in
            # TLS itself (so a plaintext request can be answered). asyncio's loop: PlainOrTls needs its
            # transports (set_protocol to a buffered protocol), which uvloop's need not honour.
            ctx, config.ssl, config.loop = config.ssl, None, "asyncio"
            http_protocol = config.http_protocol_class
            shown_host = self.url.split("://", 1)[1]

            def first_protocol(**kwargs: Any) -> asyncio.Protocol:
                return PlainOrTls(lambda: http_protocol(**kwargs), ctx, shown_host, https_path)

            config.http_protocol_class = first_protocol  # type: ignore[assignment]
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
