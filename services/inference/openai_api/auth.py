"""HTTP request headers --> the caller's Identity, and the call context the shared request steps read.

The same key ring and role table as the gRPC interceptor (shared/security/): `Authorization: Bearer <key>`
is looked up in the `KeyRing`, and the key's role must be allowed for the gRPC method the route stands for
(`/v1/chat/completions` is `Inference/Generate`, `/v1/feedback` is `Feedback/Submit`), so one table
decides both doors. A server without keys (loopback only) treats every caller as ANONYMOUS, as gRPC does.
With mutual TLS on, the TLS layer demands a client certificate signed by the CA, and the caller still
authenticates with a bearer key (the HTTP server does not expose the peer certificate's names).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from shared.rpc.grpc_util import TENANT_METADATA, PermissionDenied, Unauthenticated
from shared.security import policy
from shared.security.identity import ANONYMOUS, Identity
from shared.security.interceptor import AUTH_FAILURES
from shared.security.keys import KeyRing

GENERATE = "/apprentice.v1.Inference/Generate"
FEEDBACK = "/apprentice.v1.Feedback/Submit"
TRACE_HEADER = "x-trace-id"


def authenticate(keyring: KeyRing, authorization: str, method: str) -> Identity:
    """The identity behind an `Authorization` header value; Unauthenticated / PermissionDenied otherwise."""
    if not keyring.enabled:
        return ANONYMOUS
    if not authorization:
        AUTH_FAILURES.labels("no_credentials").inc()
        raise Unauthenticated("this server requires an `Authorization: Bearer <key>` header")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        AUTH_FAILURES.labels("bad_scheme").inc()
        raise Unauthenticated("the `Authorization` header must be `Bearer <key>`")
    identity = keyring.lookup_token(token.strip())
    if identity is None:
        AUTH_FAILURES.labels("unknown_key").inc()
        raise Unauthenticated("unknown or revoked key")
    roles = policy.allowed_roles(method)
    if identity.role not in roles:
        AUTH_FAILURES.labels("role").inc()
        allowed = ", ".join(sorted(r.value for r in roles)) or "nobody"
        raise PermissionDenied(f"{identity.role.value} key {identity.key_id!r} may not call {method} "
                               f"(allowed: {allowed})")
    return identity


class HttpCallContext:
    """The part of a gRPC `ServicerContext` that `InferenceApp`'s request steps use, for one HTTP call:
    metadata (tenant and trace headers), no deadline (HTTP clients time out on their side), and
    callbacks run when the call ends or the client goes away (they cancel its generation)."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._metadata = tuple((k, headers[k]) for k in (TENANT_METADATA, TRACE_HEADER) if headers.get(k))
        self._callbacks: list[Callable[[], None]] = []
        self._ended = False
        self._lock = threading.Lock()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if not self._ended:
                self._callbacks.append(callback)
                return True
        callback()
        return True

    def end(self) -> None:
        """The call is over (answered, failed, or abandoned by the client): run the callbacks once."""
        with self._lock:
            callbacks, self._callbacks, self._ended = self._callbacks, [], True
        for cb in callbacks:
            cb()
