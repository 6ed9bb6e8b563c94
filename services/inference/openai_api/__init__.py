"""The inference service's OpenAI-compatible HTTP API: a second door onto the same request steps.

    apprentice serve inference        # gRPC :50051 and http://127.0.0.1:8000/v1 (APPRENTICE_INFERENCE_HTTP_PORT)

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="<backend key>")
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "hi"}])
    r.id  # the interaction id (feedback: POST /v1/feedback)

Modules, one job each: `schemas` (OpenAI bodies --> GenerateRequest proto), `auth` (Bearer key -->
Identity; the call context), `models` (routing table --> /v1/models and a request's `model` --> route),
`responses` (samples --> OpenAI bodies, log-probs), `streaming` (engine events --> SSE), `errors`
(ServiceError --> HTTP status + OpenAI error JSON), `routes` (the Starlette app). The listener (uvicorn
on a thread, bind, TLS, graceful stop) is the one every HTTP server uses: `shared/rpc/http_listener.py`.
"""

from __future__ import annotations

from services.inference.calls import Calls
from services.inference.openai_api.routes import HttpApi
from shared.rpc.grpc_util import service_host
from shared.rpc.http_listener import HttpServer


def start_http(app: Calls) -> HttpServer:
    """Serve `app`'s HTTP API on `http_port`, bound like its gRPC server (host, keys, TLS)."""
    s = app.settings
    host = service_host(s.host, s.common, extra_keys=s.legacy_key_entries())
    return HttpServer(HttpApi(app).asgi, host, s.http_port, s.common, name="inference HTTP API",
                      port_var="APPRENTICE_INFERENCE_HTTP_PORT (0 disables the HTTP API)", grace_s=s.grace_s,
                      backlog=2048, keep_alive_s=30, https_path="/v1").start()


__all__ = ["start_http"]
