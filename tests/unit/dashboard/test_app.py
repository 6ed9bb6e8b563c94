"""The dashboard's HTTP surface: who gets in (operator key by bearer or sign-in cookie; backend keys refused),
what an action must carry (the action header, the confirmation, valid fields), and the graded fold served as
JSON, without the services; knowledge reads and actions (restore, retire, split) through the real Knowledge
gRPC service in process. The whole stack: the browser test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from services.dashboard.auth import ACTION_HEADER, COOKIE
from services.dashboard.settings import DashboardSettings
from services.dashboard.web import Dashboard, build
from services.extractor.servicer import create_knowledge_server
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.settings import CommonSettings
from tests.unit.dashboard.knowledge_states import (
    KAYAKS,
    RETURNS,
    RETURNS_MERGED,
    TENT_18,
    TENT_24,
    Lifecycle,
    lifecycle,
)
from tests.unit.dashboard.test_aggregates import graded
from tests.unit.extractor.test_review import KEY

OPERATOR, BACKEND = "operator-secret-0123456789", "backend-secret-0123456789"
KEYS = f"operator:alice={OPERATOR},backend:shop@shop={BACKEND}"


def dashboard(tmp_path: Path, keys: str = KEYS) -> Dashboard:
    common = CommonSettings(auth_keys=SecretStr(keys), home=tmp_path, model="m")
    settings = DashboardSettings(common=common, weights_endpoint="127.0.0.1:1", extractor_endpoint="127.0.0.1:1")
    app, _ = build(settings, start_reader=False)
    return app


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    return TestClient(dashboard(tmp_path).asgi, follow_redirects=False)


def test_pages_redirect_to_sign_in_and_api_needs_a_key(client: TestClient) -> None:
    assert client.get("/").headers["location"] == "/login"
    assert client.get("/versions").status_code == 303
    assert client.get("/api/learning").status_code == 401
    assert client.get("/api/learning", headers={"authorization": "Bearer not-a-key-at-all"}).status_code == 401
    r = client.get("/api/learning", headers={"authorization": f"Bearer {BACKEND}"})
    assert r.status_code == 403 and "operators" in r.json()["error"]
    assert client.get("/login").status_code == 200


def test_bearer_operator_reads_the_graded_fold(tmp_path: Path) -> None:
    app = dashboard(tmp_path)
    app.graded.add(graded("a", t=0, reward=1.0, success=True, version="v1"))
    client = TestClient(app.asgi)
    r = client.get("/api/learning", headers={"authorization": f"Bearer {OPERATOR}"})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    [curve] = r.json()["curves"]
    assert curve["series"][0]["version"] == "v1" and curve["series"][0]["points"][0]["reward"] == 1.0


def test_sign_in_sets_an_http_only_strict_cookie_and_sign_out_clears_it(client: TestClient) -> None:
    bad = client.post("/login", content="token=wrong-key-0123456789",
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert bad.status_code == 401 and "unknown" in bad.text
    backend = client.post("/login", data={"token": BACKEND})
    assert backend.status_code == 403
    ok = client.post("/login", data={"token": OPERATOR})
    assert ok.status_code == 303 and ok.headers["location"] == "/"
    cookie = ok.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = client.get("/")
    assert page.status_code == 200 and "alice" in page.text and "chart.umd.min.js" in page.text
    assert client.get("/api/hacking").status_code == 200
    client.post("/logout")
    assert client.get("/api/hacking").status_code == 401


@pytest.mark.parametrize(("path", "body", "headers", "status", "message"), [
    ("/api/weights/promote", {"version": "v2", "confirm": "v2"}, {}, 403, ACTION_HEADER),
    ("/api/weights/promote", {"version": "v2"}, {ACTION_HEADER: "1"}, 400, "not confirmed"),
    ("/api/weights/promote", {"version": "v2", "confirm": "v3"}, {ACTION_HEADER: "1"}, 400, "not confirmed"),
    ("/api/weights/promote", {"confirm": ""}, {ACTION_HEADER: "1"}, 400, "`version` is required"),
    ("/api/weights/canary", {"version": "v2", "confirm": "v2", "fraction": 1.5}, {ACTION_HEADER: "1"}, 400,
     "(0, 1]"),
    ("/api/weights/canary", {"version": "v2", "confirm": "v2", "fraction": "x"}, {ACTION_HEADER: "1"}, 400,
     "(0, 1]"),
    ("/api/weights/canary", {"version": "v2", "confirm": "v2", "fraction": True}, {ACTION_HEADER: "1"}, 400,
     "(0, 1]"),
    ("/api/knowledge/edit", {"key": "k", "item_id": "i", "text": "x" * 5000}, {ACTION_HEADER: "1"}, 400,
     "longer than"),
    ("/api/weights/delete", {"version": "v2", "confirm": "v2"}, {ACTION_HEADER: "1"}, 400, "unknown action"),
    ("/api/knowledge/approve", {"key": "demo/support"}, {ACTION_HEADER: "1"}, 400, "`item_id` is required"),
    ("/api/knowledge/edit", {"key": "k", "item_id": "i"}, {ACTION_HEADER: "1"}, 400, "`text` is required"),
    ("/api/knowledge/split", {"key": "k", "item_id": "i", "text": " "}, {ACTION_HEADER: "1"}, 400,
     "`text` is required"),
    ("/api/knowledge/restore", {"key": "k"}, {ACTION_HEADER: "1"}, 400, "`item_id` is required"),
    ("/api/knowledge/retire", {"key": "k", "item_id": "i"}, {}, 403, ACTION_HEADER),
    ("/api/knowledge/pin", {"key": "k", "item_id": "i"}, {ACTION_HEADER: "1"}, 400, "unknown action"),
    ("/api/knowledge/approve", {"key": 3, "item_id": "i"}, {ACTION_HEADER: "1"}, 400, "must be a string"),
])
def test_actions_are_validated_before_any_call(client: TestClient, path: str, body: dict[str, object],
                                               headers: dict[str, str], status: int, message: str) -> None:
    r = client.post(path, json=body, headers={"authorization": f"Bearer {OPERATOR}", **headers})
    assert r.status_code == status and message in r.json()["error"], r.text


def test_bad_json_is_a_clear_error_and_the_app_keeps_serving(client: TestClient) -> None:
    auth = {"authorization": f"Bearer {OPERATOR}", ACTION_HEADER: "1"}
    r = client.post("/api/weights/promote", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    assert client.post("/api/weights/promote", json=[1], headers=auth).status_code == 400
    r = client.post("/api/weights/canary", content=b'{"version": "v2", "confirm": "v2", "fraction": NaN}', headers=auth)
    assert r.status_code == 400 and "(0, 1]" in r.json()["error"]
    assert client.get("/api/learning", headers=auth).status_code == 200


def test_unreachable_service_is_a_gateway_error(client: TestClient) -> None:
    r = client.get("/api/versions", headers={"authorization": f"Bearer {OPERATOR}"})
    assert r.status_code == 502 and "UNAVAILABLE" in r.json()["error"]


def test_without_keys_everyone_is_the_anonymous_local_developer(tmp_path: Path) -> None:
    client = TestClient(dashboard(tmp_path, keys="").asgi, base_url="http://localhost:8080")
    assert client.get("/api/learning").status_code == 200
    assert "anonymous" in client.get("/").text
    # a page of another site whose name was rebound to 127.0.0.1 is not served (DNS rebinding)
    rebound = TestClient(dashboard(tmp_path, keys="").asgi, base_url="http://attacker.example:8080")
    assert rebound.get("/api/learning").status_code == 400
    assert rebound.post("/api/weights/rollback", json={"confirm": "previous"},
                        headers={ACTION_HEADER: "1"}).status_code == 400


def test_oversized_bodies_are_refused_without_reading_them(client: TestClient) -> None:
    auth = {"authorization": f"Bearer {OPERATOR}", ACTION_HEADER: "1"}
    big = b"{" + b" " * (1 << 20) + b"}"
    r = client.post("/api/weights/promote", content=big, headers=auth)
    assert r.status_code == 400 and "over" in r.json()["error"]
    r = client.post("/login", content=b"token=" + b"a" * (1 << 20),
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and COOKIE not in r.headers.get("set-cookie", "")
    assert client.get("/api/learning", headers=auth).status_code == 200       # and it keeps serving


@pytest.fixture
def knowledge_service(tmp_path: Path) -> Iterator[tuple[Lifecycle, int]]:
    """The real Knowledge gRPC service (same keys as the dashboard) over a base with an item in every state."""
    lc = lifecycle()
    server, port, _ = create_knowledge_server(lc.store, 0, host="127.0.0.1",
                                              common=CommonSettings(auth_keys=SecretStr(KEYS), home=tmp_path))
    server.start()
    yield lc, port
    server.stop(0)


def dashboard_of(tmp_path: Path, port: int) -> Dashboard:
    # reads with the operator key (the stack gives the dashboard one); actions with the signed-in caller's
    common = CommonSettings(auth_keys=SecretStr(KEYS), auth_token=SecretStr(OPERATOR), home=tmp_path, model="m")
    app, _ = build(DashboardSettings(common=common, weights_endpoint="127.0.0.1:1",
                                     extractor_endpoint=f"127.0.0.1:{port}"), start_reader=False)
    return app


def test_knowledge_page_reads_states_and_undoes_through_the_service(
        tmp_path: Path, knowledge_service: tuple[Lifecycle, int], caplog: pytest.LogCaptureFixture) -> None:
    lc, port = knowledge_service
    client = TestClient(dashboard_of(tmp_path, port).asgi)
    auth = {"authorization": f"Bearer {OPERATOR}"}
    [base] = client.get("/api/knowledge", headers=auth).json()["bases"]
    assert base["counts"] == {"pending": 1, "serving in context": 2, "consolidated": 1, "retired": 2, "rejected": 1}
    assert {i["text"]: i["actions"] for i in base["items"]}[TENT_18] == ["restore", "edit"]

    def act(action: str, item: str, **extra: str) -> dict[str, events_pb2.KnowledgeItem]:
        before = lc.snapshot().version
        r = client.post(f"/api/knowledge/{action}", json={"key": KEY, "item_id": lc.ids[item], **extra},
                        headers={**auth, ACTION_HEADER: "1"})
        assert r.status_code == 200, r.text
        assert r.json() == {"key": KEY, "version": before + 1}
        return {it.text: it for it in lc.snapshot().items}

    caplog.set_level("INFO", logger="services.dashboard.web")
    # undo a supersession: the retired item serves again; the review names the signed-in operator
    items = act("restore", TENT_18)
    assert items[TENT_18].status == events_pb2.ITEM_STATUS_APPROVED and items[TENT_18].superseded_by == ""
    review = items[TENT_18].provenance[-1]
    assert (review.action, review.principal.key_id, review.principal.role) == ("restored", "alice", "operator")
    # retire a serving item by hand
    items = act("retire", KAYAKS)
    assert items[KAYAKS].status == events_pb2.ITEM_STATUS_RETIRED and "alice" in items[KAYAKS].retired_reason
    # undo a merge: the merged text is a pending item of its own again, with its source
    items = act("split", RETURNS, text=RETURNS_MERGED)
    assert items[RETURNS_MERGED].status == events_pb2.ITEM_STATUS_PROPOSED
    assert list(items[RETURNS_MERGED].source_interaction_ids) == ["i2"]
    assert list(items[RETURNS].source_interaction_ids) == ["i1"]
    audited = [tuple(getattr(r, f) for f in ("action", "key", "item", "caller"))
               for r in caplog.records if r.getMessage() == "operator action"]
    assert audited == [(f"knowledge.{a}", KEY, lc.ids[t], "alice")
                       for a, t in (("restore", TENT_18), ("retire", KAYAKS), ("split", RETURNS))]
    [base] = client.get("/api/knowledge", headers=auth).json()["bases"]
    assert base["counts"] == {"pending": 2, "serving in context": 2, "consolidated": 1, "retired": 2, "rejected": 1}

    # what cannot succeed is the service's refusal, shown as such, and changes nothing
    version = lc.snapshot().version
    r = client.post("/api/knowledge/restore", json={"key": KEY, "item_id": lc.ids[TENT_24]},
                    headers={**auth, ACTION_HEADER: "1"})
    assert r.status_code == 409 and "not retired" in r.json()["error"]
    r = client.post("/api/knowledge/split", json={"key": KEY, "item_id": lc.ids[TENT_24], "text": "never merged"},
                    headers={**auth, ACTION_HEADER: "1"})
    assert r.status_code == 400 and "no merge of that text" in r.json()["error"]
    # the same checks as every action: the action header, an operator key
    r = client.post("/api/knowledge/retire", json={"key": KEY, "item_id": lc.ids[TENT_24]}, headers=auth)
    assert r.status_code == 403 and ACTION_HEADER in r.json()["error"]
    r = client.post("/api/knowledge/retire", json={"key": KEY, "item_id": lc.ids[TENT_24]},
                    headers={"authorization": f"Bearer {BACKEND}", ACTION_HEADER: "1"})
    assert r.status_code == 403
    assert lc.snapshot().version == version


class FakeWeights:
    """The weights service as the dashboard's backends see it: v1 served to every tenant, no canary, v2
    approved; orders are recorded, or refused with `refuse` (a gRPC error)."""

    def __init__(self, refuse: grpc.RpcError | None = None) -> None:
        self.orders: list[tuple[str, str]] = []
        self.refuse = refuse

    def versions(self) -> tuple[list[weights_pb2.Manifest], weights_pb2.StatusResponse]:
        return ([weights_pb2.Manifest(model="m", version="v1", status=weights_pb2.VERSION_STATUS_PROMOTED),
                 weights_pb2.Manifest(model="m", version="v2", status=weights_pb2.VERSION_STATUS_APPROVED)],
                weights_pb2.StatusResponse(model="m", promoted_version="v1", tenant_versions={"": "v1"}))

    def weights_order(self, action: str, version: str, **_: object) -> weights_pb2.OrderAck:
        if self.refuse is not None:
            raise self.refuse
        self.orders.append((action, version))
        return weights_pb2.OrderAck(order_id="o1", model="m", version=version, action=action)


class Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "m: tenant '*' has no previous version to roll back to (serving 'v1'); name one with --version"


@pytest.mark.parametrize(("action", "version", "status", "message"), [
    ("canary", "v1", 409, "cannot canary v1: served now (every tenant)"),
    ("promote", "v1", 409, "cannot promote v1: served now (every tenant)"),
    ("rollback", "v1", 409, "cannot roll back to v1: served now (every tenant)"),
    ("promote", "base", 409, "cannot promote base: the base: serve it with a rollback to it"),
    ("promote", "v7", 404, "cannot promote v7: m has no version v7"),
])
def test_an_order_that_cannot_succeed_is_refused_with_the_reason_and_not_sent(
        tmp_path: Path, action: str, version: str, status: int, message: str) -> None:
    app = dashboard(tmp_path)
    app.backends = weights = FakeWeights()  # type: ignore[assignment]
    r = TestClient(app.asgi).post(f"/api/weights/{action}", json={"version": version, "confirm": version,
                                                                   "fraction": 0.1},
                                  headers={"authorization": f"Bearer {OPERATOR}", ACTION_HEADER: "1"})
    assert (r.status_code, r.json()["error"]) == (status, message)
    assert weights.orders == []


def test_a_legal_order_is_sent_and_a_refusal_reads_as_words(tmp_path: Path) -> None:
    app = dashboard(tmp_path)
    app.backends = weights = FakeWeights()  # type: ignore[assignment]
    client = TestClient(app.asgi)
    auth = {"authorization": f"Bearer {OPERATOR}", ACTION_HEADER: "1"}
    r = client.post("/api/weights/canary", json={"version": "v2", "confirm": "v2", "fraction": 0.1}, headers=auth)
    assert r.status_code == 200 and weights.orders == [("canary", "v2")]
    # what only the service knows (here: no history to roll back to) comes back as its reason, not a gRPC status
    app.backends = FakeWeights(refuse=Refused())  # type: ignore[assignment]
    r = client.post("/api/weights/rollback", json={"confirm": "previous"}, headers=auth)
    assert r.status_code == 409
    assert r.json()["error"] == ("the weights service refused to roll back to the previous version: m: tenant '*' "
                                 "has no previous version to roll back to (serving 'v1'); name one with --version")
    assert r.json()["code"] == "FAILED_PRECONDITION"
