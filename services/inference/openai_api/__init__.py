"""The inference service's OpenAI-compatible HTTP API: a second door onto the same request steps.

    apprentice serve inference        # gRPC :50051 and http://127.0.0.1:8000/v1 (APPRENTICE_INFERENCE_HTTP_PORT)

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="<backend key>")
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "hi"}])
    r.id  # the interaction id (feedback: POST /v1/feedback)

Modules, one job each: `schemas` (OpenAI bodies --> GenerateRequest proto), `auth` (Bearer key -->
Identity; the call context), `models` (routing table --> /v1/models and a request's `model` --> route),
`responses` (samples --> OpenAI bodies, log-probs), `streaming` (engine events --> SSE), `errors`
(ServiceError --> HTTP status + OpenAI error JSON), `routes` (the Starlette app), `listener` (uvicorn
on a thread, bind, TLS, graceful stop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.inference.openai_api.listener import HttpListener

if TYPE_CHECKING:
    from services.inference.server import InferenceApp


def start_http(app: InferenceApp) -> HttpListener:
    """Serve `app`'s HTTP API on `http_port`, bound like its gRPC server (host, keys, TLS)."""
    from services.inference.openai_api.routes import HttpApi
    from shared.grpc_util import service_host

    s = app.settings
    host = service_host(s.host, s.common, extra_keys=s.legacy_key_entries())
    return HttpListener(HttpApi(app).asgi, host, s.http_port, s.common, grace_s=s.grace_s).start()


__all__ = ["HttpListener", "start_http"]
