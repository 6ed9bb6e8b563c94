"""gRPC server plumbing shared by every service: health, reflection, graceful stop, error mapping.

Errors are mapped to status codes in one place (`ServiceError` subclasses); handlers raise, the
`grpc_errors` decorator aborts with the right code and a precise message.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from shared.security.binding import resolve_bind_host
from shared.security.keys import KeyEntry
from shared.security.server_security import ServerSecurity
from shared.settings import CommonSettings

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

TENANT_METADATA = "x-apprentice-tenant"
LIST_SCOPE_METADATA = "x-apprentice-list-scope"
"""Trailing metadata of a list whose result depends on who asks: "all" (every tenant), "tenant" (one) or
"none" (a caller that must name a tenant and named none). An empty list then tells "nothing exists yet"
from "nothing visible to you" (the knowledge CLI words them differently)."""


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL


class InvalidRequest(ServiceError):
    """The caller sent something we will never accept; fix the request."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    """Transient: the caller may retry."""

    code = grpc.StatusCode.UNAVAILABLE


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(ServiceError):
    """A quota or size cap was hit; the caller may retry later or send less."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PortInUse(OSError):
    """A server's port is taken (or its address is not ours). Fatal: the process exits non-zero."""


def _status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ServiceError):
        return exc.code, str(exc)
    log.exception("unhandled error in handler")
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def grpc_errors(fn: F) -> F:
    """Turn ServiceError (and anything unexpected) into a gRPC status; works for sync and async handlers,
    unary and server-streaming."""
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def agen(self: Any, request: Any, context: Any) -> Any:
            try:
                async for item in fn(self, request, context):
                    yield item
            except Exception as e:  # noqa: BLE001 - mapped to a status
                if isinstance(e, grpc.aio.AbortError):
                    raise
                await context.abort(*_status_of(e))
        return agen  # type: ignore[return-value]
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def coro(self: Any, request: Any, context: Any) -> Any:
            try:
                return await fn(self, request, context)
            except Exception as e:  # noqa: BLE001
                if isinstance(e, grpc.aio.AbortError):
                    raise
                await context.abort(*_status_of(e))
        return coro  # type: ignore[return-value]
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(self: Any, request: Any, context: Any) -> Any:
            try:
                yield from fn(self, request, context)
            except Exception as e:  # noqa: BLE001
                if _is_abort(e, context):
                    raise
                context.abort(*_status_of(e))
        return gen  # type: ignore[return-value]

    @functools.wraps(fn)
    def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return fn(self, request, context)
        except Exception as e:  # noqa: BLE001
            if _is_abort(e, context):
                raise
            context.abort(*_status_of(e))
    return unary  # type: ignore[return-value]


def _is_abort(e: Exception, context: Any = None) -> bool:
    """True for the exception of a call already aborted with its status; let it through untouched.

    grpc's sync `context.abort` records the status, then raises a bare `Exception()` (grpc 1.85), so an
    abort from below the handler (the auth interceptor refusing an undecodable message of a request
    stream) must not be re-aborted as INTERNAL."""
    if type(e).__name__ in ("_AbortError", "AbortError") or isinstance(e, grpc.RpcError):
        return True
    state = getattr(context, "_state", None)
    return type(e) is Exception and bool(getattr(state, "aborted", False))


def require(cond: bool, message: str) -> None:
    """Request validation: raise INVALID_ARGUMENT with `message` unless `cond`."""
    if not cond:
        raise InvalidRequest(message)


NO_DEADLINE_S = 10 * 365 * 24 * 3600.0
"""Longer than this is gRPC's "no deadline" (grpcurl, Node, Go and Java stubs send none by default)."""


def remaining_s(context: Any) -> float | None:
    """Seconds left before the call's deadline, or None when the caller set no deadline. gRPC reports
    "no deadline" as an enormous number, which `Event.wait` and friends reject with OverflowError."""
    left = context.time_remaining()
    return None if left is None or left > NO_DEADLINE_S else max(0.0, float(left))


def metadata_value(context: Any, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


def create_server(port: int, register: Callable[[grpc.Server], None], service_names: Iterable[str], *,
                  host: str = "", max_workers: int = 16, options: list[tuple[str, Any]] | None = None,
                  common: CommonSettings | None = None,
                  extra_keys: list[KeyEntry] | None = None) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A ready (not started) sync server with health, reflection, authentication and TLS. Port 0 picks a
    free port.

    Security comes from `common` (the environment when None): the key ring admits callers through
    `AuthInterceptor`, TLS is on when a certificate is configured, and `host` "" binds every interface
    with keys and loopback without (`shared/security/binding.py`). The port is never shared with another
    process (SO_REUSEPORT off): a second server on a taken port fails here with a clear error.
    Returns (server, bound port, health servicer); call `health.set(name, SERVING)` once ready.
    """
    sec = ServerSecurity.from_settings(common or CommonSettings(), extra=extra_keys)
    names = list(service_names)
    bind_host = sec.bind_host(host, what=", ".join(names) or "gRPC server")
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=opts + (options or []),
                         interceptors=[sec.interceptor()])
    register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    address = f"[{bind_host}]:{port}" if ":" in bind_host else f"{bind_host}:{port}"
    try:
        bound = (server.add_secure_port(address, sec.credentials) if sec.credentials is not None
                 else server.add_insecure_port(address))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise PortInUse(f"cannot bind gRPC port {address}: in use by another process or not an address of "
                        f"this host; stop the other process or choose another port")
    for name in names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, bound, health_servicer


def service_host(host: str, common: CommonSettings | None = None, *,
                 extra_keys: list[KeyEntry] | None = None) -> str:
    """The address a service's other listeners (metrics, HTTP) bind: the same rule as its gRPC server."""
    sec = ServerSecurity.from_settings(common or CommonSettings(), extra=extra_keys)
    return resolve_bind_host(host, authenticated=sec.authenticated, insecure=sec.insecure, what="listener")


def set_serving(health_servicer: health.HealthServicer, names: Iterable[str], serving: bool = True) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in [*names, ""]:
        health_servicer.set(name, status)


def graceful_stop(server: grpc.Server, health_servicer: health.HealthServicer | None, grace: float = 10.0) -> None:
    """Report NOT_SERVING, refuse new calls, and let in-flight calls finish within `grace` seconds."""
    if health_servicer is not None:
        health_servicer.enter_graceful_shutdown()
    server.stop(grace).wait(grace + 1)
