"""HTTP requests --> the inference service's own request steps --> OpenAI-shaped answers.

Each route authenticates (auth.py), parses its body (schemas.py) into the same proto a gRPC caller
sends, and runs the steps the gRPC servicers run (calls.py), on a worker thread, as the caller
(`acting_as(identity)`): `prepare` (tenant, validation), `complete` / `stream` (routing, engine,
capture of every choice with its behaviour log-probs) and `submit_feedback` (ownership, caps).
Nothing here validates, generates or captures on its own, so both doors serve and record alike.

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (the Responses API, served as a
chat completion: responses_request.py, responses_output.py), GET and DELETE /v1/responses/{id} (this
pod's stored responses: response_store.py), GET /v1/models, POST /v1/feedback (Apprentice extension, the
JSON form of `FeedbackRequest`), GET /health (no auth: 200 once the model is loaded).
"""

from __future__ import annotations

import contextvars
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.inference import metrics
from services.inference.calls import Calls
from services.inference.openai_api import models as M
from services.inference.openai_api import responses as R
from services.inference.openai_api import responses_output as RO
from services.inference.openai_api.auth import FEEDBACK, GENERATE, HttpCallContext, authenticate
from services.inference.openai_api.errors import BadRequest, PayloadTooLarge, error_response, grpc_code_name
from services.inference.openai_api.response_store import ResponseStore, StoredResponse
from services.inference.openai_api.responses_request import ResponsesRequest, in_input_terms, parse_responses
from services.inference.openai_api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat,
    parse_completion,
    parse_feedback,
)
from services.inference.openai_api.streaming import (
    Events,
    SSEResponse,
    ToolPlan,
    chat_stream,
    text_stream,
    watch_disconnect,
)
from services.inference.requests import Completion, PreparedRequest, resolve_tenant
from shared.rpc.grpc_util import TENANT_METADATA, ResourceExhausted, Unavailable
from shared.rpc.json_body import InvalidJSONBody, parse_json_body
from shared.security.identity import Identity, acting_as
from shared.security.server_security import ServerSecurity

OpenAIRequest = ChatCompletionRequest | CompletionRequest
HTTP_TENANT_QUEUE = 4
"""A tenant may have this many times its worker share waiting; more is 429 (bounded memory, and a client
that floods learns to back off instead of queueing minutes of work)."""
TENANT_BUSY_RETRY_S = 1.0


class TenantBusy(ResourceExhausted):
    """A tenant's HTTP queue is full: HTTP 429 with Retry-After `retry_after_s`."""

    retry_after_s = TENANT_BUSY_RETRY_S


class TenantLimiters:
    """Each tenant's share of the HTTP worker threads (`http_tenant_share` of `http_workers`). A call takes a
    slot of its tenant's limiter before a worker thread, so a tenant's excess waits in its own queue and
    never holds every worker; the queue is FIFO per tenant (anyio's limiter wakes waiters in order).
    Limiters of tenants without calls are dropped, so the map holds only tenants with work."""

    def __init__(self, share: int) -> None:
        self.share = share
        self._by_tenant: dict[str, anyio.CapacityLimiter] = {}

    def acquire_for(self, tenant: str) -> anyio.CapacityLimiter:
        """The tenant's limiter (not yet acquired); TenantBusy when its queue is full."""
        lim = self._by_tenant.get(tenant)
        if lim is None:
            lim = self._by_tenant[tenant] = anyio.CapacityLimiter(self.share)
        stats = lim.statistics()
        if stats.tasks_waiting >= HTTP_TENANT_QUEUE * self.share:
            raise TenantBusy(f"tenant {tenant!r} already has {stats.borrowed_tokens} HTTP requests running and "
                             f"{stats.tasks_waiting} waiting on this pod; retry after {TENANT_BUSY_RETRY_S:g} s")
        return lim

    def done(self, tenant: str) -> None:
        lim = self._by_tenant.get(tenant)
        if lim is not None:
            stats = lim.statistics()
            if stats.borrowed_tokens == 0 and stats.tasks_waiting == 0:
                del self._by_tenant[tenant]


class Call:
    """One HTTP call's caller, contextvars and call context: `run` executes a blocking step on a worker
    thread as that caller, in the same context each time (the trace id set by `prepare` stays set)."""

    def __init__(self, identity: Identity, ctx: HttpCallContext, limiter: anyio.CapacityLimiter,
                 tenants: TenantLimiters | None = None, tenant: str = "") -> None:
        self.identity = identity
        self.ctx = ctx
        self.limiter = limiter
        self.tenants, self.tenant = tenants, tenant
        self._vars = contextvars.copy_context()

    def _as_caller(self, fn: Callable[..., Any], *args: Any) -> Any:
        with acting_as(self.identity):
            return fn(*args)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.tenants is None:
            return await self._run(fn, *args)
        share = self.tenants.acquire_for(self.tenant)
        try:
            async with share:
                return await self._run(fn, *args)
        finally:
            self.tenants.done(self.tenant)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(self._vars.run, self._as_caller, fn, *args, limiter=self.limiter)


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _error(e: BaseException) -> JSONResponse:
    status, body, headers = error_response(e)
    return _json(body, status, headers)


class HttpApi:
    """The routes of one inference server; `asgi` is the application uvicorn serves."""

    def __init__(self, app: Calls) -> None:
        self.app = app
        s = app.settings
        self.keyring = ServerSecurity.from_settings(s.common, extra=s.legacy_key_entries()).keyring
        self.max_body_bytes = 6 * s.max_prompt_chars + (1 << 20)
        """Any valid request fits: every prompt character JSON-escaped (6 bytes), plus 1 MiB of fields."""
        self.created = int(time.time())
        """`created` of the model cards: when this server started serving them."""
        self._limiter: anyio.CapacityLimiter | None = None
        self.tenant_limiters = TenantLimiters(max(1, int(s.http_workers * s.http_tenant_share)))
        self._text: R.TokenText | None = None
        self.store = ResponseStore()
        self.asgi = Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.stored_response, methods=["GET", "DELETE"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/feedback", self.feedback, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
        ], exception_handlers={HTTPException: self._http_exception})

    # --- plumbing ---------------------------------------------------------------------------------
    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:           # created on the server's event loop, on first use
            self._limiter = anyio.CapacityLimiter(self.app.settings.http_workers)
        return self._limiter

    @property
    def token_text(self) -> R.TokenText:
        if self._text is None:
            self._text = R.TokenText(self.app.engine.tokenizer)
        return self._text

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _json({"error": {"message": f"{request.method} {request.url.path}: {exc.detail}",
                                "type": "invalid_request_error", "param": None, "code": code}}, exc.status_code)

    async def _body(self, request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise PayloadTooLarge(f"the body is {declared} bytes; at most {self.max_body_bytes} are accepted")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > self.max_body_bytes:
                raise PayloadTooLarge(f"the body exceeds {self.max_body_bytes} bytes")
        try:
            return parse_json_body(data)
        except InvalidJSONBody as e:
            raise BadRequest(str(e)) from None

    def _call(self, request: Request, method: str) -> Call:
        identity = authenticate(self.keyring, request.headers.get("authorization", ""), method)
        # The share is keyed by who asks: a backend key's own tenant, else the tenant header (operators,
        # services, servers without keys); a body naming another tenant is still checked by `prepare`.
        tenant = identity.tenant or request.headers.get(TENANT_METADATA, "") or identity.key_id
        return Call(identity, HttpCallContext(request.headers), self.limiter, self.tenant_limiters, tenant[:128])

    @staticmethod
    def _count(method: str, code: str, t0: float) -> None:
        metrics.REQUESTS.labels(method=method, code=code).inc()
        metrics.LATENCY.labels(method=method).observe(time.perf_counter() - t0)

    # --- generation -------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "http.chat.completions", parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "http.completions", parse_completion)

    async def _generate(self, request: Request, method: str, parse: Callable[[Any], OpenAIRequest]) -> Response:
        t0 = time.perf_counter()
        try:
            call = self._call(request, GENERATE)
            req = parse(await self._body(request))
            if req.stream:
                return await self._stream(call, req, t0, method)
            try:
                p, done = await watch_disconnect(request.receive, call.ctx.end,
                                                 lambda: call.run(self._complete, call, req, t0))
            finally:
                call.ctx.end()
            served = R.Served.now(done.ids, done.version, p.session_id, req.model or self.app.model,
                                  len(p.prompt_ids))
            build = R.chat_completion if isinstance(req, ChatCompletionRequest) else R.text_completion
            body = build(served, done.samples, self.token_text, _logprobs(req))
            if isinstance(req, ChatCompletionRequest) and p.tools:
                R.attach_tool_calls(body, done.samples, done.ids, p.tools, p.tool_choice, p.parallel_tool_calls)
        except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI error body
            self._count(method, grpc_code_name(e), t0)
            return _error(e)
        self._count(method, "OK", t0)
        return _json(body, headers=served.headers)

    def _prepare(self, call: Call, req: OpenAIRequest) -> tuple[PreparedRequest, tuple[str, bool] | None]:
        """The shared preparation, then the request's `model` --> None (route) or a pinned version."""
        p = self.app.prepare(req.to_proto(), call.ctx)
        if asked := _logprobs(req):
            # alternatives are an HTTP-only ask (GenerateRequest has no field for them): the engine computes
            # them only when a request sets this, so other calls pay no extra vocabulary pass
            p.sampling = dataclasses.replace(p.sampling, top_logprobs=asked)
        assert self.app.manager is not None, "prepare refuses calls until the version manager exists"
        return p, M.resolve(self.app.manager.table, self.app.model, req.model, p.tenant)

    def _complete(self, call: Call, req: OpenAIRequest, t0: float) -> tuple[PreparedRequest, Completion]:
        p, pin = self._prepare(call, req)
        return p, self.app.complete(p, call.ctx, t0, pin)

    def _open_stream(self, call: Call, req: OpenAIRequest,
                     t0: float) -> tuple[PreparedRequest, str, list[str], Events]:
        p, pin = self._prepare(call, req)
        version, ids, events = self.app.stream(p, call.ctx, t0, pin)
        return p, version, ids, events

    async def _stream(self, call: Call, req: OpenAIRequest, t0: float, method: str) -> Response:
        """Validation, routing and queueing happen before the status line, so a bad request is a plain
        400; what fails later is reported inside the stream. From here on the stream ends the call."""
        try:
            p, version, ids, events = await call.run(self._open_stream, call, req, t0)
        except BaseException:
            call.ctx.end()
            raise
        served = R.Served.now(ids, version, p.session_id, req.model or self.app.model, len(p.prompt_ids))
        body = (chat_stream(call, events, served, p.sampling.n, self.token_text, _logprobs(req),
                            req.include_usage, tools=_plan(p))
                if isinstance(req, ChatCompletionRequest) else
                text_stream(call, events, served, p.sampling.n, self.token_text, _logprobs(req), req.include_usage))
        return self._sse(call, body, served, method, t0, error_prefix=b'data: {"error"')

    def _sse(self, call: Call, body: AsyncIterator[bytes], served: R.Served, method: str, t0: float, *,
             error_prefix: bytes) -> SSEResponse:
        """The stream as an SSE response that ends the call and counts it (an error frame, starting with
        `error_prefix`, counts as STREAM_ERROR; a client gone, as CANCELLED) when it stops."""
        async def counted() -> AsyncIterator[bytes]:
            code = "OK"
            try:
                async for chunk in body:
                    if chunk.startswith(error_prefix):
                        code = "STREAM_ERROR"
                    yield chunk
            except BaseException:
                code = "CANCELLED"
                raise
            finally:
                call.ctx.end()
                self._count(method, code, t0)

        return SSEResponse(counted(), served.headers, on_disconnect=call.ctx.end)

    # --- the Responses API ----------------------------------------------------------------------------
    async def responses(self, request: Request) -> Response:
        t0, method = time.perf_counter(), "http.responses"
        try:
            call = self._call(request, GENERATE)
            req = parse_responses(await self._body(request))
            if req.stream:
                return await self._stream_response(call, req, t0, method)
            try:
                opened = await watch_disconnect(request.receive, call.ctx.end,
                                                lambda: call.run(self._open_response, call, req, t0))
            finally:
                call.ctx.end()
            p, chat, prior, done = opened
            assert isinstance(done, Completion)
            served = R.Served.now(done.ids, done.version, p.session_id, chat.model or self.app.model,
                                  len(p.prompt_ids))
            sample = done.samples[0]
            text, calls = RO.split(sample, done.ids[0], _plan(p))
            result = RO.finished(req, served, sample, text, calls, self.token_text, _logprobs(chat))
            self._keep(req, p, prior, result)
        except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI error body
            self._count(method, grpc_code_name(e), t0)
            return _error(in_input_terms(e))
        self._count(method, "OK", t0)
        return _json(result.body, headers=served.headers)

    def _open_response(self, call: Call, req: ResponsesRequest, t0: float,
                       stream: bool = False) -> tuple[PreparedRequest, ChatCompletionRequest, list[dict[str, Any]],
                                                      Completion | tuple[str, list[str], Events]]:
        """On a worker thread, as the caller: the stored conversation it continues (only the caller's tenant
        finds it), the request as a chat completion, then the chat route's steps."""
        history, session = [], ""
        if req.previous_response_id:
            tenant = resolve_tenant(req.tenant, call.ctx, self.app.settings)
            before = self.store.get(req.previous_response_id, tenant)
            history, session = before.history, before.session_id
        chat = req.to_chat(history, session)
        prior = history + req.input_messages()
        p, pin = self._prepare(call, chat)
        opened = self.app.stream(p, call.ctx, t0, pin) if stream else self.app.complete(p, call.ctx, t0, pin)
        return p, chat, prior, opened

    def _keep(self, req: ResponsesRequest, p: PreparedRequest, prior: list[dict[str, Any]],
              result: RO.Finished) -> None:
        if req.stored and result.body["status"] != "cancelled":
            self.store.put(result.body["id"], StoredResponse(p.tenant, p.session_id,
                                                             prior + [RO.history_of(result.text, result.calls)],
                                                             result.body))

    async def _stream_response(self, call: Call, req: ResponsesRequest, t0: float, method: str) -> Response:
        try:
            p, chat, prior, (version, ids, events) = await call.run(self._open_response, call, req, t0, True)
        except BaseException:
            call.ctx.end()
            raise
        served = R.Served.now(ids, version, p.session_id, chat.model or self.app.model, len(p.prompt_ids))
        body = RO.response_stream(call, events, req, served, _plan(p), self.token_text, _logprobs(chat),
                                  on_done=lambda result: self._keep(req, p, prior, result))
        return self._sse(call, body, served, method, t0, error_prefix=b"event: error")

    async def stored_response(self, request: Request) -> Response:
        """GET: a response this pod stored (the caller's tenant only); DELETE: forget it."""
        t0, method = time.perf_counter(), f"http.responses.{request.method.lower()}"
        try:
            call = self._call(request, GENERATE)
            rid = str(request.path_params["response_id"])
            tenant = await call.run(resolve_tenant, request.query_params.get("tenant", ""), call.ctx,
                                    self.app.settings)
            if request.method == "DELETE":
                self.store.delete(rid, tenant)
                body = {"id": rid, "object": "response.deleted", "deleted": True}
            else:
                body = self.store.get(rid, tenant).body
        except Exception as e:  # noqa: BLE001
            self._count(method, grpc_code_name(e), t0)
            return _error(e)
        self._count(method, "OK", t0)
        return _json(body)

    # --- models, feedback, health -----------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            call = self._call(request, GENERATE)
            manager = self.app.manager
            if manager is None:
                raise Unavailable("the model is still loading; retry shortly")
            cards = [m.card(self.app.model, self.created) for m in M.listing(manager.table, self.app.model,
                                                                              call.identity)]
        except Exception as e:  # noqa: BLE001
            self._count("http.models", grpc_code_name(e), t0)
            return _error(e)
        self._count("http.models", "OK", t0)
        return _json({"object": "list", "data": cards})

    async def feedback(self, request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            call = self._call(request, FEEDBACK)
            fb = parse_feedback(await self._body(request))
            ack = await call.run(self.app.submit_feedback, fb, call.ctx)
        except Exception as e:  # noqa: BLE001
            self._count("http.feedback", grpc_code_name(e), t0)
            return _error(e)
        self._count("http.feedback", "OK", t0)
        return _json({"event_id": ack.event_id, "accepted": ack.accepted})

    async def health(self, request: Request) -> Response:
        try:
            self.app.check_ready()             # the readiness rule every call of either door passes
        except Unavailable as e:
            return _json({"status": "unavailable", "reason": str(e)}, 503)
        return _json({"status": "ok"})


def _plan(p: PreparedRequest) -> ToolPlan:
    return ToolPlan(p.tools, p.tool_choice, p.parallel_tool_calls)


def _logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """None = no log-probs; else how many top log-probs per token were asked for."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs
