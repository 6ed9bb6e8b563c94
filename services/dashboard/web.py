"""The dashboard's web app: the Starlette routes (pages, JSON endpoints, operator actions) over the
aggregates the topic reader folds (reader.py, aggregates.py) and the services' answers (backends.py).
The process's handle that serves it is service.py.

Pages are server-side Jinja2 templates that draw themselves from small JSON endpoints, fetched again
every `refresh_s` seconds (`static/dashboard.js`, charts by the vendored Chart.js):

    GET  /            learning: reward, KPI success and response length over time per tenant/task/version
    GET  /versions    lineage, gate results (learning curve), serving state, promote/canary/rollback
    GET  /hacking     detector flags and quarantined counts over time, flagged examples
    GET  /knowledge   items per tenant: state, provenance, merges, supersession; approve / reject / edit pending
                      ones, retire serving ones, restore retired ones, split merged texts off again
    GET  /health      each service, consumer lag per group and partition, spool depth
    GET  /api/{learning,versions,hacking,knowledge,health}
    POST /api/weights/{promote,canary,rollback}      {"version", "fraction", "reason", "confirm"}
    POST /api/knowledge/{approve,reject,edit,restore,retire,split}   {"key", "item_id", "text"}
                      (text: edit's new text; split's merged text, which becomes its own proposal again)
    GET|POST /login, POST /logout                     the operator's sign-in (auth.py)
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import grpc
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from services.dashboard import auth
from services.dashboard.aggregates import GradedFold, UpdatesFold
from services.dashboard.backends import Backends, Targets
from services.dashboard.reader import TopicReader
from services.dashboard.settings import DashboardSettings
from services.dashboard.views import knowledge_view, version_actions, versions_view
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.json_body import InvalidJSONBody, parse_json_body
from shared.security.keys import KeyRing
from shared.security.server_security import ServerSecurity

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PAGES = {"learning": "Learning", "versions": "Versions", "hacking": "Reward hacking", "knowledge": "Knowledge",
         "health": "Health"}
WEIGHTS_ACTIONS = ("promote", "canary", "rollback")
KNOWLEDGE_ACTIONS = ("approve", "reject", "edit", "restore", "retire", "split")
KNOWLEDGE_TEXT_ACTIONS = ("edit", "split")
MAX_BODY = 64 * 1024
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
MAX_TEXT = 4000
GRPC_HTTP = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
             grpc.StatusCode.FAILED_PRECONDITION: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
             grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.ALREADY_EXISTS: 409}


async def _bounded_body(request: Request) -> bytes:
    """The request body, refused past MAX_BODY without reading the rest (uvicorn sets no limit of its own)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise BadRequest(f"request body over {MAX_BODY} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadRequest(f"request body over {MAX_BODY} bytes")
    return bytes(raw)


class BadRequest(ValueError):
    pass


def _grpc_error(e: grpc.RpcError) -> JSONResponse:
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return JSONResponse({"error": f"{code.name}: {details}"}, status_code=GRPC_HTTP.get(code, 502))


REFUSALS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS)
"""gRPC codes by which a service refuses an order (its message says why); others mean it failed."""


def _order_words(action: str, version: str) -> str:
    """"promote v3", "canary v3", "roll back to v3", "roll back to the previous version"."""
    return f"{'roll back to' if action == 'rollback' else action} {version or 'the previous version'}"


def _order_error(action: str, version: str, e: grpc.RpcError) -> JSONResponse:
    """A refused or failed weights order, in words: what was asked and the service's reason."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    what = _order_words(action, version)
    message = (f"the weights service refused to {what}: {details}" if code in REFUSALS
               else f"could not {what}: the weights service answered {code.name}: {details}")
    return JSONResponse({"error": message, "code": code.name}, status_code=GRPC_HTTP.get(code, 502))


class Dashboard:
    """The pages and endpoints over the aggregates (`graded`, `updates`) and the services (`backends`)."""

    def __init__(self, settings: DashboardSettings, keyring: KeyRing, backends: Backends, graded: GradedFold,
                 updates: UpdatesFold, reader: TopicReader | None = None) -> None:
        self.s, self.keyring, self.backends = settings, keyring, backends
        self.graded, self.updates, self.reader = graded, updates, reader
        self.secure_cookie = settings.common.tls_cert is not None
        self.sessions = auth.Sessions()
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        routes: list[BaseRoute] = [Route(f"/{'' if name == 'learning' else name}", self._page(name)) for name in PAGES]
        routes += [
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/api/learning", self.api_learning),
            Route("/api/versions", self.api_versions),
            Route("/api/hacking", self.api_hacking),
            Route("/api/knowledge", self.api_knowledge),
            Route("/api/health", self.api_health),
            Route("/api/weights/{action}", self.api_weights_action, methods=["POST"]),
            Route("/api/knowledge/{action}", self.api_knowledge_action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ]
        middleware = []
        if not keyring.enabled:
            # Without keys everyone who reaches it is the local developer, and it binds loopback only; a page
            # on another site can still reach loopback through DNS rebinding (its own name resolving to
            # 127.0.0.1), so only loopback names are served. With keys, the operator key decides.
            middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_NAMES)))
        self.asgi = Starlette(routes=routes, middleware=middleware)

    # --- authentication ----------------------------------------------------------------------------
    def _caller(self, request: Request) -> auth.Caller:
        return auth.authenticate(self.keyring, request.headers.get("authorization", ""),
                                 request.cookies.get(auth.COOKIE, ""), self.sessions)

    def _api(self, request: Request, *, action: bool = False) -> auth.Caller | JSONResponse:
        try:
            caller = self._caller(request)
        except auth.NotSignedIn as e:
            return JSONResponse({"error": str(e)}, status_code=401)
        except auth.Forbidden as e:
            return JSONResponse({"error": str(e)}, status_code=403)
        if action and request.headers.get(auth.ACTION_HEADER) != "1":
            return JSONResponse({"error": f"actions need the `{auth.ACTION_HEADER}: 1` header"}, status_code=403)
        return caller

    def _page(self, name: str) -> Any:
        async def page(request: Request) -> Response:
            try:
                caller = self._caller(request)
            except (auth.NotSignedIn, auth.Forbidden):
                return RedirectResponse("/login", status_code=303)
            return self.templates.TemplateResponse(request, f"{name}.html", {
                "page": name, "pages": PAGES, "refresh_ms": int(self.s.refresh_s * 1000), "model": self.s.common.model,
                "user": caller.identity.key_id, "signed_in": self.keyring.enabled})
        return page

    async def login_form(self, request: Request, error: str = "", status: int = 200) -> Response:
        return self.templates.TemplateResponse(request, "login.html", {
            "page": "login", "pages": PAGES, "error": error, "keys": self.keyring.enabled, "signed_in": False},
            status_code=status)

    async def login(self, request: Request) -> Response:
        try:
            body = (await _bounded_body(request)).decode("utf-8", "replace")
        except BadRequest as e:
            return await self.login_form(request, str(e), status=413)
        token = (parse_qs(body).get("token") or [""])[0].strip()
        if not self.keyring.enabled:
            return RedirectResponse("/", status_code=303)
        try:
            auth.check_token(self.keyring, token)
        except (auth.NotSignedIn, auth.Forbidden) as e:
            return await self.login_form(request, str(e), status=401 if isinstance(e, auth.NotSignedIn) else 403)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(auth.COOKIE, self.sessions.open(token), httponly=True, samesite="strict",
                            secure=self.secure_cookie, path="/", max_age=int(auth.SESSION_TTL_S))
        return response

    async def logout(self, request: Request) -> Response:
        """Revoke the session server-side (a copied cookie stops working), then clear the browser's cookie."""
        self.sessions.close(request.cookies.get(auth.COOKIE, ""))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(auth.COOKIE, path="/", httponly=True, samesite="strict", secure=self.secure_cookie)
        return response

    # --- data --------------------------------------------------------------------------------------
    async def api_learning(self, request: Request) -> Response:
        if isinstance(c := self._api(request), JSONResponse):
            return c
        tenant = request.query_params.get("tenant") or None
        return _json({"bucket_s": self.graded.bucket_s, "tenants": self.graded.tenants(),
                      "curves": self.graded.curves(tenant)})

    async def api_hacking(self, request: Request) -> Response:
        if isinstance(c := self._api(request), JSONResponse):
            return c
        return _json({"bucket_s": self.graded.bucket_s,
                      "tenants": self.graded.hacking(request.query_params.get("tenant") or None)})

    async def api_versions(self, request: Request) -> Response:
        if isinstance(c := self._api(request), JSONResponse):
            return c
        try:
            manifests, status = await run_in_threadpool(self.backends.versions)
        except grpc.RpcError as e:
            return _grpc_error(e)
        return _json({**versions_view(manifests, status), "model": self.s.common.model,
                      "orders": self.updates.timeline(self.s.common.model)[-50:]})

    async def api_knowledge(self, request: Request) -> Response:
        if isinstance(c := self._api(request), JSONResponse):
            return c
        try:
            snapshots = await run_in_threadpool(self.backends.knowledge)
        except grpc.RpcError as e:
            return _grpc_error(e)
        return _json({"bases": knowledge_view(snapshots)})

    async def api_health(self, request: Request) -> Response:
        if isinstance(c := self._api(request), JSONResponse):
            return c
        report = await run_in_threadpool(self.backends.health)
        report["dashboard"] = {"graded_records": self.graded.records,
                               "reader_error": self.reader.error if self.reader else "",
                               "undecodable": self.reader.undecodable if self.reader else 0,
                               # records skipped for who wrote them (services/dashboard/reader.py)
                               "untrusted": self.reader.untrusted if self.reader else 0}
        return _json(report)

    # --- operator actions --------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await _bounded_body(request)
        try:
            body = parse_json_body(raw or b"{}")
        except InvalidJSONBody as e:
            raise BadRequest(str(e)) from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    async def api_weights_action(self, request: Request) -> Response:
        if isinstance(caller := self._api(request, action=True), JSONResponse):
            return caller
        action = request.path_params["action"]
        try:
            if action not in WEIGHTS_ACTIONS:
                raise BadRequest(f"unknown action {action!r}: one of {', '.join(WEIGHTS_ACTIONS)}")
            body = await self._body(request)
            version = _text(body, "version", required=action != "rollback")
            # The confirmation step: the client repeats what it shows the operator ("" = the previous version).
            if str(body.get("confirm", "")).strip() != (version or "previous"):
                raise BadRequest(f"not confirmed: send `confirm` = {version or 'previous'!r} after showing the "
                                 f"operator what {action} will do")
            fraction = 0.0
            if action == "canary":
                raw_fraction = body.get("fraction", 0)
                if isinstance(raw_fraction, bool) or not isinstance(raw_fraction, int | float):
                    raise BadRequest("`fraction` must be a number in (0, 1]")
                fraction = float(raw_fraction)
                if not (math.isfinite(fraction) and 0 < fraction <= 1):
                    raise BadRequest("`fraction` must be a number in (0, 1]")
            reason = _text(body, "reason") or f"dashboard: {action} by {caller.identity.key_id}"
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        if (refused := await self._refusal(action, version)) is not None:
            return refused
        try:
            ack = await run_in_threadpool(lambda: self.backends.weights_order(
                action, version, fraction=fraction, reason=reason, token=caller.token))
        except grpc.RpcError as e:
            return _order_error(action, version, e)
        log.info("operator action", extra={"action": f"weights.{action}", "version": ack.version,
                                           "caller": caller.identity.key_id})
        return _json({"order_id": ack.order_id, "action": ack.action, "version": ack.version})

    async def _refusal(self, action: str, version: str) -> JSONResponse | None:
        """The page's own rules (views.version_actions) on the current state: an order that cannot succeed
        is answered with the reason the page shows, without sending it. None = send it (also when the state
        cannot be read: the order's own answer then says what is wrong)."""
        if not version:
            return None
        try:
            manifests, status = await run_in_threadpool(self.backends.versions)
        except grpc.RpcError:
            return None
        m = next((m for m in manifests if m.version == version), None)
        if m is None and version == BASE:
            m = weights_pb2.Manifest(model=self.s.common.model, version=BASE,
                                     status=weights_pb2.VERSION_STATUS_APPROVED)
        if m is None:
            return JSONResponse({"error": f"cannot {_order_words(action, version)}: {self.s.common.model} has no "
                                          f"version {version}"}, status_code=404)
        offered, why = version_actions(m, {x.version for x in manifests}, status)
        if action in offered:
            return None
        return JSONResponse({"error": f"cannot {_order_words(action, version)}: {why[action]}"}, status_code=409)

    async def api_knowledge_action(self, request: Request) -> Response:
        if isinstance(caller := self._api(request, action=True), JSONResponse):
            return caller
        action = request.path_params["action"]
        try:
            if action not in KNOWLEDGE_ACTIONS:
                raise BadRequest(f"unknown action {action!r}: one of {', '.join(KNOWLEDGE_ACTIONS)}")
            body = await self._body(request)
            key, item = _text(body, "key", required=True), _text(body, "item_id", required=True)
            text = _text(body, "text", required=action in KNOWLEDGE_TEXT_ACTIONS, limit=MAX_TEXT)
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        try:
            snap = await run_in_threadpool(lambda: self.backends.knowledge_action(
                action, key, item, text=text, operator=caller.identity.key_id, token=caller.token))
        except grpc.RpcError as e:
            return _grpc_error(e)
        log.info("operator action", extra={"action": f"knowledge.{action}", "key": key, "item": item,
                                           "caller": caller.identity.key_id})
        return _json({"key": snap.key, "version": snap.version})


def _text(body: dict[str, Any], name: str, *, required: bool = False, limit: int = 200) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise BadRequest(f"`{name}` must be a string")
    value = value.strip()
    if required and not value:
        raise BadRequest(f"`{name}` is required")
    if len(value) > limit:
        raise BadRequest(f"`{name}` is longer than {limit} characters")
    return value


def _finite(data: Any) -> Any:
    """`data` with NaN/Inf floats as null: JSON has no such numbers, and one NaN gate score of one version made
    Starlette's encoder (allow_nan=False) raise, so /api/versions answered 500 and the page broke."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def _json(data: Any) -> JSONResponse:
    return JSONResponse(_finite(data), headers={"cache-control": "no-store"})


def build(settings: DashboardSettings, *, start_reader: bool = True) -> tuple[Dashboard, TopicReader | None]:
    """The app and its reader (started), from settings."""
    keyring = ServerSecurity.from_settings(settings.common).keyring
    graded = GradedFold(bucket_s=settings.bucket_s, max_interactions=settings.max_interactions,
                        examples=settings.examples)
    updates = UpdatesFold()
    reader = TopicReader(settings.common, graded, updates).start() if start_reader else None
    backends = Backends(settings, Targets.resolve(settings))
    return Dashboard(settings, keyring, backends, graded, updates, reader), reader
