"""Attacks on the OpenAI-compatible HTTP API's body parsing (SECURITY.md §4), replayed against the real
inference service on loopback. Each one failed before the fix with HTTP 500 and the exception's name in the
body (`RecursionError`, `UnicodeEncodeError`): a 100k-deep JSON array, and a lone UTF-16 surrogate escape.
Both are the client's mistake: they must be a 400 with an OpenAI-style error body naming no exception.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.helpers.inference import start_inference
from tests.helpers.ports import free_port

pytestmark = pytest.mark.integration
EXCEPTION_NAMES = ("RecursionError", "UnicodeEncodeError", "UnicodeDecodeError", "Traceback", "Error:")


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_deep_and_surrogate_bodies_are_400_without_exception_names(
        kafka_bootstrap: str, tiny_model_name: str, tmp_path: Path) -> None:
    http_port = free_port()
    app = start_inference(tmp_path, model=tiny_model_name, bootstrap=kafka_bootstrap, follow_updates=False,
                          heartbeat_interval_s=0, capture=False, http_port=http_port)
    base = f"http://127.0.0.1:{http_port}"
    model = json.dumps(app.model)
    surrogate = ('{"model": ' + model + ', "messages": [{"role": "user", "content": "hi \\ud800 there"}]}').encode()
    surrogate_key = ('{"model": ' + model + ', "\\udfff": 1, "messages": [{"role": "user", "content": "hi"}]}').encode()
    bodies = {"deep": _deep(100_000), "surrogate": surrogate, "surrogate_key": surrogate_key}
    try:
        with httpx.Client(timeout=60) as c:
            for path in ("/v1/chat/completions", "/v1/completions", "/v1/feedback"):
                for name, body in bodies.items():
                    r = c.post(base + path, content=body, headers={"content-type": "application/json"})
                    assert r.status_code == 400, (path, name, r.status_code, r.text[:300])
                    err = r.json()["error"]
                    assert err["type"] == "invalid_request_error" and err["message"], (path, name, err)
                    assert not any(n in r.text for n in EXCEPTION_NAMES), (path, name, r.text[:300])
            # a well-formed request still works
            ok = c.post(base + "/v1/chat/completions",
                        json={"model": app.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            assert ok.status_code == 200, ok.text
    finally:
        app.stop()
