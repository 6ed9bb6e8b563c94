"""A plaintext request on an HTTPS listener gets one line of plain HTTP naming the https:// URL and how to
trust the stack's CA (instead of a reset that stock clients report as "Connection error."), and the
listener keeps serving TLS clients, before and after, on the same port."""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.rpc.http_listener import HttpServer, plaintext_reply
from shared.settings import CommonSettings
from tools.devca import ensure_dev_credentials


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": f"hello over {scope['scheme']}".encode()})


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[HttpServer, ssl.SSLContext]]:
    creds = ensure_dev_credentials(tmp_path)
    common = CommonSettings(tls_cert=creds.server_cert, tls_key=creds.server_key)
    server = HttpServer(_hello, "127.0.0.1", 0, common, name="test", port_var="PORT", https_path="/v1").start()
    try:
        yield server, ssl.create_default_context(cafile=str(creds.ca))
    finally:
        server.stop(1)


def _tls_get(port: int, ctx: ssl.SSLContext) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_a_plaintext_request_is_told_to_use_https_and_tls_keeps_working(
        https: tuple[HttpServer, ssl.SSLContext]) -> None:
    server, ctx = https
    assert _tls_get(server.port, ctx) == (200, "hello over https")
    for _ in range(2):      # twice: a refused plaintext request leaves the listener as it was
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:{server.port}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".encode())
            got = b""
            while chunk := s.recv(4096):
                got += chunk
        head, _, body = got.decode().partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 400 "), got
        assert body == (f"this port speaks HTTPS: use https://localhost:{server.port}/v1 and trust the stack's "
                        "CA (eval \"$(apprentice env)\")\n")
        assert _tls_get(server.port, ctx) == (200, "hello over https")


def test_plain_http_client_reads_the_line(https: tuple[HttpServer, ssl.SSLContext]) -> None:
    """What `curl http://` or `requests.get("http://...")` show: a 400 whose body is the line."""
    server, _ = https
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/v1/models")
    resp = conn.getresponse()
    assert resp.status == 400
    assert resp.read().decode().startswith(f"this port speaks HTTPS: use https://127.0.0.1:{server.port}/v1 ")


def test_reply_without_a_host_header_names_the_listener() -> None:
    reply = plaintext_reply(b"GET / HTTP/1.0\r\n\r\n", "127.0.0.1:8443", "/")
    assert reply.endswith(b"use https://127.0.0.1:8443/ and trust the stack's CA (eval \"$(apprentice env)\")\n")
    evil = plaintext_reply(b"GET / HTTP/1.1\r\nHost: a\x1b[31m\r\n\r\n", "127.0.0.1:1", "/v1")
    assert b"\x1b" not in evil and b"https://127.0.0.1:1/v1" in evil
