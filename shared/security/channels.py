"""Target + settings --> a channel that dials another service as this process's identity.

The one way Apprentice code opens a gRPC channel: TLS when a CA is configured (the server is verified;
a client certificate is presented under mutual TLS), and `authorization: Bearer <key>` added to every
call from `APPRENTICE_AUTH_TOKEN` / `APPRENTICE_AUTH_TOKEN_FILE` (the file is re-read when it changes, so
a rotated key is picked up by long-lived channels). A call that already carries `authorization` keeps it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from shared.security.tls import channel_credentials
from shared.settings import CommonSettings

Options = Sequence[tuple[str, Any]]


class TokenSource:
    """This process's bearer key, from the environment value or a mounted file (checked once a second)."""

    def __init__(self, value: str = "", file: Path | None = None) -> None:
        self._value, self._file = value.strip(), file
        self._cached, self._checked = "", 0.0
        self._sig: tuple[int, int] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, common: CommonSettings) -> TokenSource:
        return cls(common.auth_token.get_secret_value(), common.auth_token_file)

    def __call__(self) -> str:
        if self._value or self._file is None:
            return self._value
        if time.monotonic() - self._checked >= 1.0 or self._sig is None:
            with self._lock:
                # Checked again under the lock, and the clock set only once the file was read: concurrent
                # first calls (a thread pool's) all wait for the read instead of sending no key at all.
                if time.monotonic() - self._checked >= 1.0 or self._sig is None:
                    try:
                        st = self._file.stat()
                        sig = (st.st_mtime_ns, st.st_size)
                        if sig != self._sig:
                            self._cached, self._sig = self._file.read_text().strip(), sig
                    except OSError:
                        pass  # a file being replaced: keep the last key read
                    self._checked = time.monotonic()
        return self._cached


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: Callable[[], str]) -> None:
        self.token = token

    def _with_token(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        md = list(d.metadata or ())
        token = self.token()
        if not token or any(k == "authorization" for k, _ in md):
            return d
        md.append(("authorization", f"Bearer {token}"))
        return _CallDetails(d.method, d.timeout, md, d.credentials, getattr(d, "wait_for_ready", None),
                            getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._with_token(client_call_details), request_iterator)


def replica_target(addresses: Sequence[str]) -> str:
    """One gRPC target over several replicas of a service ("host:port" each): the channel connects to the
    first that answers and moves to the next when it goes (gRPC's `ipv4:` address list, pick_first), as a
    Kubernetes Service does for a Deployment's pods. A single address stays as it is."""
    if len(addresses) == 1:
        return addresses[0]
    return "ipv4:" + ",".join(addresses)


def with_authority(target: str, options: Options = ()) -> list[tuple[str, Any]]:
    """`options`, plus the authority of an address-list target (`replica_target`): gRPC would otherwise
    present the whole list as the server's name, which no certificate names, and TLS verification fails.
    The first address's host is what each replica's certificate is issued for (they share one name)."""
    opts = list(options)
    if target.startswith(("ipv4:", "ipv6:")) and not any(k == "grpc.default_authority" for k, _ in opts):
        first = target.split(":", 1)[1].split(",", 1)[0]
        opts.append(("grpc.default_authority", first.rsplit(":", 1)[0].strip("[]") or "localhost"))
    return opts


def open_channel(target: str, common: CommonSettings | None = None, *, options: Options = (),
                 token: str | None = None) -> grpc.Channel:
    """A sync channel to `target` with this process's TLS settings and key (`token` overrides the key)."""
    common = common or CommonSettings()
    creds = channel_credentials(common)
    opts = with_authority(target, options)
    raw = grpc.secure_channel(target, creds, options=opts) if creds else grpc.insecure_channel(target, options=opts)
    source: Callable[[], str] = (lambda: token) if token is not None else TokenSource.from_settings(common)
    return grpc.intercept_channel(raw, _Bearer(source))


def open_aio_channel(target: str, common: CommonSettings | None = None, *,
                     options: Options = ()) -> grpc.aio.Channel:
    """An asyncio channel with this process's TLS settings; add `auth_metadata(common)` to each call."""
    common = common or CommonSettings()
    creds = channel_credentials(common)
    opts = with_authority(target, options)
    return grpc.aio.secure_channel(target, creds, options=opts) if creds else grpc.aio.insecure_channel(target, options=opts)


def auth_metadata(common: CommonSettings | None = None) -> list[tuple[str, str]]:
    """`authorization` metadata for this process's key (empty without one), for asyncio calls."""
    token = TokenSource.from_settings(common or CommonSettings())()
    return [("authorization", f"Bearer {token}")] if token else []
