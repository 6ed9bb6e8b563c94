"""gRPC call --> authenticated Identity --> the handler, or UNAUTHENTICATED / PERMISSION_DENIED.

One server interceptor for every service (installed by `shared.rpc.grpc_util.create_server`):
1. public methods (health, reflection) pass untouched;
2. the caller is authenticated: `authorization: Bearer <key>` metadata, else a client certificate the
   server's CA verified (mutual TLS), mapped through the `KeyRing`; a server without keys treats every
   caller as ANONYMOUS (it is bound to loopback, see `binding.py`);
3. the caller's role must be allowed for the method (`policy.METHOD_ROLES`, deny by default);
4. the handler runs with `current_identity()` set.
It also turns request bytes that do not parse as the method's message into INVALID_ARGUMENT (grpc's own
default is INTERNAL), so a client sending garbage learns it sent garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from shared.security import policy
from shared.security.identity import ANONYMOUS, Identity, acting_as
from shared.security.keys import KeyRing

log = logging.getLogger(__name__)

AUTH_FAILURES = Counter("apprentice_auth_failures_total", "Calls refused by authentication or authorisation",
                        ["reason"])


class _Undecodable:
    """Stands in for a request message whose bytes did not parse."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe_deserializer(deserialize: Callable[[bytes], Any] | None, type_name: str) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, TypeError) as e:
            return _Undecodable(f"request bytes are not a valid {type_name}: {e}")
    return parse


def _metadata(context: grpc.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


def _cert_names(context: grpc.ServicerContext) -> list[str]:
    """Common name and SAN entries of the peer certificate grpc verified (empty without mutual TLS)."""
    ctx = context.auth_context() or {}
    names = [*ctx.get("x509_common_name", []), *ctx.get("x509_subject_alternative_name", [])]
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


class AuthInterceptor(grpc.ServerInterceptor):
    def __init__(self, keyring: KeyRing) -> None:
        self.keyring = keyring

    def authenticate(self, context: grpc.ServicerContext) -> Identity | None:
        """The caller's identity, or None after aborting the call with UNAUTHENTICATED."""
        if not self.keyring.enabled:
            return ANONYMOUS
        auth = _metadata(context, "authorization")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "bad_scheme",
                             "`authorization` metadata must be `Bearer <key>`")
            identity = self.keyring.lookup_token(token.strip())
            if identity is None:
                self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "unknown_key", "unknown or revoked key")
            return identity
        names = _cert_names(context)
        if names:
            identity = self.keyring.lookup_cert(names)
            if identity is None:
                self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "unknown_cert",
                             "the client certificate is not mapped to any identity")
            return identity
        self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "no_credentials",
                     "this server requires `authorization: Bearer <key>` metadata or a client certificate")
        return None

    @staticmethod
    def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, reason: str, message: str) -> None:
        AUTH_FAILURES.labels(reason).inc()
        context.abort(code, message)

    def _admit(self, method: str, context: grpc.ServicerContext) -> Identity:
        identity = self.authenticate(context)
        assert identity is not None, "authenticate aborts the call when it returns None"
        if identity.is_anonymous:
            return identity
        roles = policy.allowed_roles(method)
        if identity.role not in roles:
            allowed = ", ".join(sorted(r.value for r in roles)) or "nobody"
            self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, "role",
                         f"{identity.role.value} key {identity.key_id!r} may not call {method} (allowed: {allowed})")
        return identity

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or policy.is_public(method):
            return handler
        return self._wrap(handler, method)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        type_name = method.rsplit("/", 1)[-1] + " request"
        deser = _safe_deserializer(handler.request_deserializer, type_name)
        ser = handler.response_serializer

        def check(request: Any, context: grpc.ServicerContext) -> None:
            if isinstance(request, _Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)

        def checked_iter(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            for r in requests:
                check(r, context)
                yield r

        if handler.unary_unary:
            inner_uu = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                identity = self._admit(method, context)      # an unknown caller learns nothing else
                check(request, context)
                with acting_as(identity):
                    return inner_uu(request, context)
            return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=deser,
                                                       response_serializer=ser)
        if handler.unary_stream:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                identity = self._admit(method, context)
                check(request, context)
                with acting_as(identity):
                    yield from inner_us(request, context)
            return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=deser,
                                                        response_serializer=ser)
        if handler.stream_unary:
            inner_su = handler.stream_unary

            def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                with acting_as(self._admit(method, context)):
                    return inner_su(checked_iter(requests, context), context)
            return grpc.stream_unary_rpc_method_handler(stream_unary, request_deserializer=deser,
                                                        response_serializer=ser)
        inner_ss = handler.stream_stream

        def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            identity = self._admit(method, context)
            with acting_as(identity):
                yield from inner_ss(checked_iter(requests, context), context)
        return grpc.stream_stream_rpc_method_handler(stream_stream, request_deserializer=deser,
                                                     response_serializer=ser)
