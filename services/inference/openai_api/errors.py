"""A failed HTTP call --> OpenAI's error JSON with the matching status: the one place HTTP statuses are chosen.

The request path raises the same `ServiceError`s as for gRPC (shared/rpc/grpc_util.py); this module maps their
status codes to HTTP, and names the request field at fault (`param`) when the message names one, so a
client library shows the same precise message a gRPC caller gets. Shape:
`{"error": {"message": str, "type": str, "param": str | null, "code": str | null}}`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import grpc
from pydantic import ValidationError

from services.inference.requests import ContextLengthExceeded
from shared.rpc.grpc_util import InvalidRequest, NotFound, ServiceError

log = logging.getLogger(__name__)

# gRPC status --> (HTTP status, OpenAI error type, default code)
_HTTP: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", "failed_precondition"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", None),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", "permission_denied"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error", "not_found"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error", "conflict"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error", "cancelled"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "invalid_request_error", "not_implemented"),
}
_INTERNAL = (500, "server_error", "internal_error")

DEFAULT_RETRY_AFTER_S = 1
"""Retry-After of a 429 whose cause names no wait of its own (`retry_after_s` on the exception)."""

# Field names in the shared validation messages --> the OpenAI request parameter they come from.
_PARAMS = (
    ("sampling.max_new_tokens", "max_tokens"), ("sampling.temperature", "temperature"),
    ("sampling.top_p", "top_p"), ("sampling.top_k", "top_k"), ("sampling.n", "n"), ("sampling.seed", "seed"),
    ("sampling.stop", "stop"), ("messages", "messages"), ("prompt", "prompt"), ("session_id", "session_id"),
    ("task", "task"), ("tenant", "tenant"), ("interaction_id", "interaction_id"), ("kind", "kind"),
    ("value", "value"), ("comment", "comment"), ("kpi_name", "kpi_name"), ("occurred_at", "occurred_at"),
)
_WORD = re.compile(r"[A-Za-z_.\[\]0-9]+")


class ModelNotFound(NotFound):
    """The request's `model` is neither the served model nor a version this caller may use."""


class PayloadTooLarge(InvalidRequest):
    """The request body exceeds the size any valid request can have."""


class BadRequest(InvalidRequest):
    """An HTTP-level request error that names its parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _param_of(message: str) -> tuple[str, str] | None:
    """(field, OpenAI parameter) a shared validation message is about (its first word names the field)."""
    first = _WORD.match(message)
    word = first.group(0) if first else ""
    for field, param in _PARAMS:
        if word == field or word.startswith(field + "[") or word.startswith(field + "."):
            return field, param
    return None


def _in_http_terms(message: str) -> tuple[str, str | None]:
    """A shared validation message in the HTTP caller's words: `sampling.max_new_tokens must be ...` -->
    `max_tokens must be ...`, and the parameter it names."""
    found = _param_of(message)
    if found is None:
        return message, None
    field, param = found
    if field.startswith("sampling."):
        message = param + message[len(field):]
    return message, param


def from_validation(e: ValidationError, what: str) -> BadRequest:
    """A pydantic validation failure of the request body --> one precise 400 (the first problem)."""
    err = e.errors(include_url=False)[0]
    loc = ".".join(str(x) for x in err["loc"])
    got = err.get("input")
    shown = repr(got)[:80] if not isinstance(got, dict) else "an object"
    return BadRequest(f"{what}: `{loc}` {err['msg'].lower()} (got {shown})", param=str(err["loc"][0]))


def error_response(e: BaseException) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(HTTP status, OpenAI error body, extra headers) for any exception raised while serving a call."""
    headers: dict[str, str] = {}
    if isinstance(e, ServiceError):
        status, kind, code = _HTTP.get(e.code, _INTERNAL)
        message, param = str(e), getattr(e, "param", None)
        code = getattr(e, "error_code", None) or code
        if status == 400 and param is None:
            message, param = _in_http_terms(message)
        if isinstance(e, ModelNotFound):
            code, param = "model_not_found", "model"
        elif isinstance(e, PayloadTooLarge):
            status, code = 413, "request_too_large"
        elif isinstance(e, ContextLengthExceeded):
            code = "context_length_exceeded"
        if status == 429:
            headers["Retry-After"] = str(max(1, round(float(getattr(e, "retry_after_s", DEFAULT_RETRY_AFTER_S)))))
    else:
        log.exception("unhandled error in an HTTP handler")
        status, kind, code = _INTERNAL
        # the exception's name and text stay in the log: they describe the server, not the client's mistake
        message, param = "internal error (logged on the server)", None
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}, headers


def grpc_code_name(e: BaseException) -> str:
    """The status name the request metrics count (the same labels as the gRPC handlers')."""
    return e.code.name if isinstance(e, ServiceError) else "INTERNAL"
