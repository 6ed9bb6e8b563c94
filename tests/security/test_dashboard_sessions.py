"""Attack (issue #33 item 8, SECURITY.md §4): the dashboard's sign-in cookie held the operator key itself, so
a copied cookie (a shared browser profile, a cookie-store dump) was a key that works on every gRPC server,
and signing out only asked the browser to forget it: the copy kept working. Now the cookie holds a random
session id kept server-side (services/dashboard/auth.py `Sessions`), sign-out revokes it, and it expires.

The dashboard's real Starlette app is driven over HTTP in process; no service behind it is called."""

from __future__ import annotations

import secrets
from typing import Any

from starlette.testclient import TestClient

from services.dashboard import auth
from services.dashboard.aggregates import GradedFold, UpdatesFold
from services.dashboard.backends import Backends, Targets
from services.dashboard.settings import DashboardSettings
from services.dashboard.web import Dashboard
from shared.security.keys import KeyRing

OPERATOR_KEY = secrets.token_urlsafe(32)


def _client() -> tuple[Dashboard, TestClient]:
    settings = DashboardSettings()
    keyring = KeyRing.from_text(f"operator:ops={OPERATOR_KEY}")
    dash = Dashboard(settings, keyring, Backends(settings, Targets(grpc={})), GradedFold(), UpdatesFold())
    return dash, TestClient(dash.asgi, base_url="http://dashboard.test")


def _get(client: TestClient, cookie: str) -> Any:
    """An API read presenting only `cookie` (a fresh cookie jar each time, as a thief's browser would)."""
    client.cookies.clear()
    client.cookies.set(auth.COOKIE, cookie)
    return client.get("/api/learning")


def _sign_in(client: TestClient) -> str:
    r = client.post("/login", data={"token": OPERATOR_KEY}, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie = r.cookies.get(auth.COOKIE)
    assert cookie
    return cookie


def test_cookie_is_a_session_id_not_the_key() -> None:
    _, client = _client()
    cookie = _sign_in(client)
    assert cookie != OPERATOR_KEY and OPERATOR_KEY not in cookie
    assert _get(client, cookie).status_code == 200
    # The key itself in the cookie is not a session.
    fresh = TestClient(client.app, base_url="http://dashboard.test")
    assert _get(fresh, OPERATOR_KEY).status_code == 401


def test_copied_cookie_stops_working_after_sign_out() -> None:
    _, client = _client()
    cookie = _sign_in(client)
    copy = TestClient(client.app, base_url="http://dashboard.test")
    assert _get(copy, cookie).status_code == 200
    r = client.post("/logout", follow_redirects=False)
    assert r.status_code == 303
    assert _get(copy, cookie).status_code == 401


def test_sessions_expire() -> None:
    now = [1000.0]
    sessions = auth.Sessions(ttl_s=60, clock=lambda: now[0])
    sid = sessions.open(OPERATOR_KEY)
    assert sessions.token(sid) == OPERATOR_KEY
    now[0] += 61
    assert sessions.token(sid) is None
    keyring = KeyRing.from_text(f"operator:ops={OPERATOR_KEY}")
    try:
        auth.authenticate(keyring, "", sid, sessions)
    except auth.NotSignedIn:
        pass
    else:
        raise AssertionError("an expired session was admitted")
