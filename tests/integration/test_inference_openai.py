"""The OpenAI-compatible HTTP API end to end: the official `openai` SDKs (Python sync and async, Node) against
the real inference server (tiny real model, real broker), with keys and TLS on as in `apprentice up`.

Answers carry the interaction ids (`id`, the `apprentice` field, a header) and are captured on the
interactions topic exactly as gRPC answers are (same fields, behaviour log-probs, policy version, caller);
feedback sent to /v1/feedback reaches the feedback topic under the same ownership and caps; every error is
OpenAI's JSON with the matching status; a client that goes away cancels its generation; the listener
answers 503 while the model loads, refuses a taken port and drains in-flight streams on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import grpc
import httpx
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice
from prometheus_client import REGISTRY

from services.inference.client import InferenceClient, MessagesLike
from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from shared.proto.apprentice.v1 import events_pb2
from shared.rpc.grpc_util import PortInUse
from tests.helpers.inference import start_inference
from tests.helpers.kafka import collect
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for
from tests.security.harness import SECURITY_VARS
from tools.devca import DevCredentials, ensure_dev_credentials, make_ca

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "tests" / "node"
FEEDBACK_CAP = 4
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello?"}]
ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass
class Door:
    """The secured server and how each kind of caller reaches it."""

    app: Any
    creds: DevCredentials

    @property
    def model(self) -> str:
        return str(self.app.model)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.app.http_port}/v1"

    @property
    def trust(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.creds.ca))

    def key(self, tenant: str = "acme") -> str:
        return self.creds.token(self.creds.backend_token(tenant))

    def sdk(self, tenant: str = "acme") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=self.key(tenant), max_retries=0,
                             http_client=httpx.Client(verify=self.trust))  # type: ignore[arg-type]  # the SDK accepts an httpx client; its annotation names only httpx2's

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, verify=self.trust, timeout=60)

    def grpc(self, tenant: str = "acme") -> InferenceClient:
        target = f"127.0.0.1:{self.app.port}"
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(self.creds.ca.read_bytes()))
        return InferenceClient(target, api_key=self.key(tenant), channel=channel)


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    t = Topics(prefix=f"test-oai-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, t)
    yield t
    with contextlib.suppress(Exception):
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()])


@pytest.fixture(scope="module")
def door(ns: Topics, kafka_bootstrap: str, tiny_model_name: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    with open_door(ns, kafka_bootstrap, tiny_model_name, tmp_path_factory) as d:
        yield d


@contextlib.contextmanager
def open_door(ns: Topics, kafka_bootstrap: str, model: str, tmp_path_factory: pytest.TempPathFactory,
              **overrides: Any) -> Iterator[Door]:
    """Keys (APPRENTICE_AUTH_KEYS: operator, services, backends of acme and globex), TLS with the dev CA's
    server certificate, signed interaction ids: the way `apprentice up` runs the service. `overrides`: more
    InferenceSettings (the engine, for the engine contract)."""
    home = tmp_path_factory.mktemp("openai")
    creds = ensure_dev_credentials(home, tenants=("acme", "globex"))
    with pytest.MonkeyPatch.context() as mp:
        for name in SECURITY_VARS:
            mp.delenv(name, raising=False)
        mp.setenv("APPRENTICE_AUTH_KEYS", creds.keys_file.read_text())
        mp.setenv("APPRENTICE_TLS_CERT", str(creds.server_cert))
        mp.setenv("APPRENTICE_TLS_KEY", str(creds.server_key))
        mp.setenv("APPRENTICE_INTERACTION_ID_SECRET_FILE", str(creds.interaction_id_secret))
        app = start_inference(home, model=model, bootstrap=kafka_bootstrap, topic_prefix=ns.prefix,
                              http_port=free_port(), follow_updates=False, heartbeat_interval_s=0,
                              feedback={"max_per_interaction": FEEDBACK_CAP}, pii_policy="keep", **overrides)
        try:
            yield Door(app, creds)
        finally:
            app.stop(2)


def _interactions(bootstrap: str, ns: Topics, ids: list[str]) -> dict[str, events_pb2.Interaction]:
    got = collect(bootstrap, ns.interactions, events_pb2.Interaction, want=ids)
    return {e.interaction_id: e for e in got if e.interaction_id in ids}


def _apprentice(r: pydantic.BaseModel) -> Any:
    """The server's `apprentice` extension of an SDK response (a field the SDK keeps as an extra)."""
    assert r.model_extra is not None
    return r.model_extra["apprentice"]


def _tokens(c: Choice) -> list[ChatCompletionTokenLogprob]:
    assert c.logprobs is not None and c.logprobs.content is not None
    return c.logprobs.content


def _populated(e: events_pb2.Interaction) -> set[str]:
    return {f.name for f, _ in e.ListFields()} | {f"envelope.{f.name}" for f, _ in e.envelope.ListFields()}


# --- the Python SDK ----------------------------------------------------------------------------------
def test_sync_chat_n_logprobs_is_captured_like_grpc(door: Door, kafka_bootstrap: str, ns: Topics) -> None:
    raw = door.sdk().chat.completions.with_raw_response.create(
        model=door.model, messages=MESSAGES, n=3, temperature=0.8, seed=7, max_tokens=12, logprobs=True,
        top_logprobs=1, user="sess-http", extra_body={"task": "support"})
    r = raw.parse()
    ext = _apprentice(r)
    ids = ext["interaction_ids"]
    assert r.id == ids[0] and len(set(ids)) == 3 and raw.headers["x-apprentice-interaction-ids"] == ",".join(ids)
    assert raw.headers["x-apprentice-policy-version"] == ext["policy_version"] == r.system_fingerprint == "base"
    assert ext["session_id"] == "sess-http" and [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage is not None and r.usage.completion_tokens == sum(len(_tokens(c)) for c in r.choices) > 0
    with door.grpc() as g:
        # MESSAGES: plain role/content dicts, typed as the SDK's message params
        gr = g.generate(cast(MessagesLike, MESSAGES), max_new_tokens=12, temperature=0.8, seed=7, n=3, session_id="sess-grpc",
                        task="support")
    grpc_ids = [c.interaction_id for c in gr.choices]
    events = _interactions(kafka_bootstrap, ns, ids + grpc_ids)
    assert set(events) == set(ids + grpc_ids)
    assert len({events[i].group_id for i in ids}) == 1
    for c, iid in zip(r.choices, ids, strict=True):
        e = events[iid]
        tokens = _tokens(c)
        assert e.envelope.tenant == "acme" and e.task == "support"
        assert e.session_id == door.app.privacy.sessions("acme", "sess-http")      # its keyed pseudonym
        assert e.envelope.principal.key_id == "acme-backend" and e.envelope.principal.role == "backend"
        assert e.response_text == c.message.content and e.finish_reason == c.finish_reason
        assert len(e.response_token_ids) == len(e.response_logprobs_t1) == len(tokens)
        assert list(e.response_logprobs) == pytest.approx([t.logprob for t in tokens], abs=1e-5)
        assert all(len(t.top_logprobs) == 1 and t.bytes and t.top_logprobs[0].bytes for t in tokens)  # the most likely
        assert e.policy_version == "base" and e.group_size == 3 and e.sample_index == c.index and not e.raw_prompt
        assert e.sampling.temperature == pytest.approx(0.8) and e.sampling.max_new_tokens == 12
        assert [m.role for m in e.messages] == ["system", "user"]
        assert _populated(e) == _populated(events[grpc_ids[c.index]])      # the same record as a gRPC answer


def test_async_client_concurrent_calls_and_stream(door: Door, kafka_bootstrap: str, ns: Topics) -> None:
    async def main() -> tuple[list[Any], str, list[str]]:
        async with openai.AsyncOpenAI(base_url=door.base_url, api_key=door.key("globex"), max_retries=0,
                                      http_client=httpx.AsyncClient(verify=door.trust)) as c:  # type: ignore[arg-type]  # the SDK accepts an httpx client; its annotation names only httpx2's
            rs = await asyncio.gather(*(c.chat.completions.create(
                model=door.model, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=4)
                for i in range(4)))
            stream = await c.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=6,
                                                     stream=True)
            text, ids = "", list[str]()
            async for chunk in stream:
                ids = ids or (chunk.model_extra or {}).get("apprentice", {}).get("interaction_ids", [])
                text += "".join(ch.delta.content or "" for ch in chunk.choices)
            return rs, text, ids

    rs, text, stream_ids = asyncio.run(main())
    ids = [r.id for r in rs]
    assert len(set(ids)) == 4 and stream_ids
    events = _interactions(kafka_bootstrap, ns, ids + stream_ids)
    assert {e.envelope.tenant for e in events.values()} == {"globex"} and len(events) == 5
    assert events[stream_ids[0]].response_text == text


def test_streaming_chat_with_usage_adds_up_to_the_captured_answers(door: Door, kafka_bootstrap: str,
                                                                   ns: Topics) -> None:
    raw = door.sdk().chat.completions.with_raw_response.create(
        model=door.model, messages=MESSAGES, n=2, max_tokens=10, temperature=1.0, seed=3, stream=True,
        stream_options={"include_usage": True}, logprobs=True)
    ids = raw.headers["x-apprentice-interaction-ids"].split(",")
    chunks = list(raw.parse())
    assert _apprentice(chunks[0])["interaction_ids"] == ids and all(c.id == ids[0] for c in chunks)
    assert {ch.delta.role for ch in chunks[0].choices} == {"assistant"}
    text = {0: "", 1: ""}
    finish: dict[int, str] = {}
    logprobs: dict[int, list[float]] = {}
    for chunk in chunks[:-1]:
        for ch in chunk.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
                assert ch.logprobs is not None and ch.logprobs.content is not None
                logprobs[ch.index] = [t.logprob for t in ch.logprobs.content]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens == sum(len(v) for v in logprobs.values()) > 0
    events = _interactions(kafka_bootstrap, ns, ids)
    for i, iid in enumerate(ids):
        e = events[iid]
        assert e.response_text == text[i] and e.finish_reason == finish[i] and e.group_size == 2
        assert list(e.response_logprobs) == pytest.approx(logprobs[i], abs=1e-5)


def test_text_completions_whole_and_streamed(door: Door, kafka_bootstrap: str, ns: Topics) -> None:
    client = door.sdk()
    r = client.completions.create(model=door.model, prompt="Once upon a time", max_tokens=5, logprobs=1,
                                  temperature=0.7, seed=11)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and r.usage is not None
    assert r.object == "text_completion" and len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert lp.top_logprobs is not None and len(lp.top_logprobs) == len(lp.tokens)
    assert all(len(d) == 1 for d in lp.top_logprobs)          # the most likely alternative (sampled: not always chosen)
    streamed = list(client.completions.create(model=door.model, prompt="Twice", max_tokens=4, stream=True))
    sid = _apprentice(streamed[0])["interaction_ids"][0]
    events = _interactions(kafka_bootstrap, ns, [r.id, sid])
    e = events[r.id]
    assert e.raw_prompt and e.prompt_text == "Once upon a time" and e.response_text == r.choices[0].text
    assert list(e.response_logprobs) == pytest.approx(lp.token_logprobs, abs=1e-5)
    assert events[sid].response_text == "".join(c.choices[0].text for c in streamed if c.choices)


def test_models_list_and_naming_a_version(door: Door) -> None:
    client = door.sdk()
    assert [m.id for m in client.models.list()] == [door.model, "base"]
    r = client.chat.completions.create(model="base", messages=MESSAGES, max_tokens=2)
    assert r.system_fingerprint == "base" and r.model == "base"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"


# --- feedback --------------------------------------------------------------------------------------
def test_feedback_reaches_the_topic_with_ownership_and_caps(door: Door, kafka_bootstrap: str, ns: Topics) -> None:
    client = door.sdk()
    iid = client.chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=3).id
    when = datetime.now(UTC).isoformat()
    # the SDK's own request helper reaches the extension (the README's example)
    via_sdk = client.post("/feedback", cast_to=object, body={"interaction_id": iid, "kind": "rating", "value": 4})
    assert isinstance(via_sdk, dict) and via_sdk["accepted"] and via_sdk["event_id"]
    with door.http(door.key("acme")) as h, door.http(door.key("globex")) as other:
        a1 = h.post("/feedback", json={"interaction_id": iid, "kind": "kpi", "value": 12.5,
                                       "kpi_name": "resolved_minutes", "occurred_at": when})
        a2 = h.post("/feedback", json={"interaction_id": iid, "kind": "correction", "comment": "It is 42."})
        assert a1.status_code == a2.status_code == 200 and a1.json()["accepted"] and a2.json()["accepted"]
        stolen = other.post("/feedback", json={"interaction_id": iid, "kind": "thumbs", "value": -1})
        assert stolen.status_code == 403 and stolen.json()["error"]["type"] == "permission_error"
        bad = h.post("/feedback", json={"interaction_id": iid, "kind": "thumbs", "value": 3})
        assert bad.status_code == 400 and "+1 or -1" in bad.json()["error"]["message"]
        a3 = h.post("/feedback", json={"interaction_id": iid, "kind": "thumbs", "value": 1})
        flood = h.post("/feedback", json={"interaction_id": iid, "kind": "thumbs", "value": 1})
        assert a3.status_code == 200 and flood.status_code == 429 and int(flood.headers["retry-after"]) >= 1
        assert set(flood.json()["error"]) == ERROR_KEYS and flood.json()["error"]["code"] == "rate_limit_exceeded"
    wanted = [a1.json()["event_id"], a2.json()["event_id"]]
    got = {e.envelope.event_id: e for e in collect(kafka_bootstrap, ns.feedback, events_pb2.FeedbackEvent,
                                                   want=wanted, key=lambda m: m.envelope.event_id)}
    kpi, correction = got[wanted[0]], got[wanted[1]]
    assert kpi.interaction_id == iid and kpi.kpi_name == "resolved_minutes" and kpi.value == 12.5
    assert correction.comment == "It is 42." and correction.envelope.tenant == "acme"
    assert correction.envelope.principal.key_id == "acme-backend"


# --- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("body", "status", "param", "needle"), [
    ({"messages": MESSAGES, "temperature": 9}, 400, "temperature", "temperature must be within [0, 5]"),
    ({"messages": MESSAGES, "max_tokens": 99999}, 400, "max_tokens", "max_tokens must be <= 2048"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages", "messages[0].role"),
    ({"messages": [{"role": "user", "content": "hi " * 2100}]}, 400, "messages", "context window"),
    ({"messages": MESSAGES, "n": 3, "temperature": 0}, 400, "n", "needs temperature > 0"),
    ({"messages": MESSAGES, "tenant": "globex"}, 403, None, "acts for tenant 'acme'"),
    ({"messages": MESSAGES, "model": "nope"}, 404, "model", "'nope' does not exist"),
])
def test_errors_are_openai_json_with_the_matching_status(door: Door, body: dict[str, Any], status: int,
                                                         param: str | None, needle: str) -> None:
    with door.http(door.key("acme")) as h:
        r = h.post("/chat/completions", json=body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == ERROR_KEYS and err["param"] == param and needle in err["message"]
        assert h.get("/models").status_code == 200          # and the server keeps serving


def test_authentication_errors_and_other_statuses(door: Door) -> None:
    with door.http() as anon, door.http("not-a-key-of-this-server") as wrong:
        for r in (anon.get("/models"), wrong.get("/models"),
                  anon.post("/chat/completions", json={"messages": MESSAGES}),
                  anon.get("/models", headers={"authorization": "Basic dXNlcjpwYXNz"})):
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert "Bearer" in anon.get("/models").json()["error"]["message"]
    with door.http(door.key("acme")) as h:
        assert h.post("/chat/completions", content=b"{not json").status_code == 400
        missing = h.get("/embeddings")
        assert missing.status_code == 404 and set(missing.json()["error"]) == ERROR_KEYS
        huge = h.post("/chat/completions", content=b"x" * (3 << 20), headers={"content-type": "application/json"})
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=door.base_url, api_key="wrong", max_retries=0,
                      http_client=httpx.Client(verify=door.trust)).models.list()  # type: ignore[arg-type]  # the SDK accepts an httpx client; its annotation names only httpx2's
    with pytest.raises(openai.PermissionDeniedError):
        door.sdk().chat.completions.create(model=door.model, messages=MESSAGES, extra_body={"tenant": "globex"})
    with pytest.raises(openai.BadRequestError):
        door.sdk().chat.completions.create(model=door.model, messages=MESSAGES, temperature=7)


def test_tls_only_and_only_for_clients_that_trust_the_ca(door: Door, tmp_path: Path) -> None:
    plain = httpx.get(f"http://127.0.0.1:{door.app.http_port}/v1/models", timeout=10)   # served nothing, told how
    assert plain.status_code == 400 and plain.text.startswith(
        f"this port speaks HTTPS: use https://127.0.0.1:{door.app.http_port}/v1 and trust the stack's CA"), plain.text
    other_ca, _ = make_ca(tmp_path / "other")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{door.base_url}/models", verify=ssl.create_default_context(cafile=str(other_ca)), timeout=10)


def test_a_client_that_goes_away_cancels_its_generation(door: Door, kafka_bootstrap: str, ns: Topics) -> None:
    body = {"model": door.model, "messages": [{"role": "user", "content": "write a long essay"}],
            "max_tokens": 2000, "temperature": 1.0}
    for _attempt in range(5):
        session = f"gone-{uuid.uuid4().hex[:6]}"
        try:
            with door.http(door.key()) as h:
                h.post("/chat/completions", json={**body, "session_id": session}, timeout=0.5)
        except httpx.TimeoutException:
            break
        # the tiny random model may sample its end-of-sequence token within 0.5 s
    else:
        pytest.fail("five sampled essays all ended before the client's 0.5 s timeout")
    captured = door.app.privacy.sessions("acme", session)     # the session's pseudonym on the topic
    got = collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[captured],
                  key=lambda m: m.session_id)
    gone = [g for g in got if g.session_id == captured]
    assert gone and gone[0].finish_reason == "cancelled" and 0 < len(gone[0].response_token_ids) < 2000

    def cancelled() -> float:
        return REGISTRY.get_sample_value("apprentice_inference_requests_total",
                                         {"method": "http.chat.completions", "code": "CANCELLED"}) or 0.0

    before = cancelled()
    with door.http(door.key()) as h, h.stream("POST", "/chat/completions", json={**body, "stream": True}) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))      # streaming, then hang up
    wait_for(lambda: cancelled() > before, what="the hung-up stream counted as cancelled")
    t0 = time.monotonic()
    door.sdk().chat.completions.create(model=door.model, messages=MESSAGES, max_tokens=2)
    assert time.monotonic() - t0 < 10.0              # the engine is not still writing either essay


# --- the Node SDK ----------------------------------------------------------------------------------
def test_node_sdk_smoke(door: Door, kafka_bootstrap: str, ns: Topics) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed on this machine")
    if not (NODE_DIR / "node_modules" / "openai" / "package.json").exists():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            pytest.skip(f"npm could not install the openai Node SDK: {done.stderr.strip()[-400:]}")
    env = {"PATH": str(Path(node).parent), "HOME": str(Path.home()), "BASE_URL": door.base_url,
           "API_KEY": door.key("acme"), "MODEL": door.model, "NODE_EXTRA_CA_CERTS": str(door.creds.ca)}
    out = subprocess.run([node, "smoke.mjs"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    ids = res["apprentice"]["interaction_ids"]
    assert res["id"] == ids[0] and res["headerIds"] == ",".join(ids) and res["headerVersion"] == "base"
    assert len(res["choices"]) == 2 and res["usage"]["completion_tokens"] == sum(
        len(c["logprobs"]) for c in res["choices"])
    assert res["streamUsage"]["completion_tokens"] > 0 and res["streamIds"]
    assert res["models"] == [door.model, "base"] and res["notFound"] == {"status": 404, "code": "model_not_found"}
    events = _interactions(kafka_bootstrap, ns, ids + res["streamIds"])
    for c, iid in zip(res["choices"], ids, strict=True):
        e = events[iid]
        assert e.session_id == door.app.privacy.sessions("acme", "node-user") and e.response_text == c["text"] and e.envelope.tenant == "acme"
        assert list(e.response_logprobs) == pytest.approx(c["logprobs"], abs=1e-5)
    assert events[res["streamIds"][0]].response_text == res["streamed"]


# --- life cycle (a server of its own: no keys, loopback) ----------------------------------------------
def test_503_while_loading_dev_mode_port_conflict_and_graceful_drain(
        kafka_bootstrap: str, ns: Topics, tiny_model_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.inference.service import InferenceApp
    from services.inference.settings import InferenceSettings
    from shared.privacy.policy import PiiPolicy
    from shared.settings import CommonSettings

    for name in SECURITY_VARS:
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    app = InferenceApp(InferenceSettings(
        port=0, metrics_port=0, http_port=port, host="127.0.0.1", spool_dir=tmp_path / "spool",
        heartbeat_interval_s=0, follow_updates=False, grace_s=30, pii_policy=PiiPolicy.KEEP,
        common=CommonSettings(model=tiny_model_name, kafka_bootstrap=kafka_bootstrap, topic_prefix=ns.prefix,
                              home=tmp_path)))
    # the model load is held until a request has seen the loading window (a warm process loads the tiny
    # model and the PII detector in well under the time of one HTTP round trip)
    loaded = threading.Event()
    real_engine_start = app.engine.start

    def held_engine_start() -> None:
        assert loaded.wait(60), "no request reached the HTTP listener while the model was loading"
        real_engine_start()

    monkeypatch.setattr(app.engine, "start", held_engine_start)
    starter = threading.Thread(target=app.start)
    starter.start()
    try:
        wait_for(lambda: app.http_port != 0, what="the HTTP port bound")
        seen = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=30) as h:
            while not app.ready.is_set():
                r = h.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
                seen.append(r.status_code)
                if r.status_code == 503:
                    err = r.json()["error"]
                    assert set(err) == ERROR_KEYS and err["type"] == "server_error"
                    assert err["code"] == "service_unavailable" and "loading" in err["message"]
                    loaded.set()
                else:
                    assert r.status_code == 200 and app.ready.is_set(), r.text     # (it became ready in between)
            starter.join(timeout=120)
            assert 503 in seen
            assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200

            # no keys configured: any key (the SDK needs one) acts as the anonymous local developer
            dev = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="local", max_retries=0)
            r2 = dev.chat.completions.create(model=tiny_model_name, messages=MESSAGES, max_tokens=2)
            assert _apprentice(r2)["interaction_ids"][0] == r2.id

            # a second server cannot take the port (no SO_REUSEPORT sharing of traffic)
            with pytest.raises(PortInUse, match="HTTP port"):
                start_inference(tmp_path / "second", model=tiny_model_name, bootstrap=kafka_bootstrap,
                                topic_prefix=ns.prefix, http_port=port, follow_updates=False, heartbeat_interval_s=0)

            # graceful stop: a stream in flight completes, then new connections are refused
            body = {"messages": MESSAGES, "max_tokens": 150, "temperature": 1.0, "stream": True}
            with h.stream("POST", "/chat/completions", json=body) as s:
                lines = s.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                stopper = threading.Thread(target=app.stop)
                stopper.start()
                rest = [line for line in lines if line.startswith("data: ")]
            stopper.join(timeout=60)
            assert rest[-1] == "data: [DONE]"
            assert any('"finish_reason":"length"' in line or '"finish_reason":"stop"' in line for line in rest)
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        starter.join(timeout=120)
        app.stop(1)
    got = collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[r2.id])
    assert any(e.interaction_id == r2.id and e.envelope.tenant == "default" for e in got)
