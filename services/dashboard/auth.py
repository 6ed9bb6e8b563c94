"""Who may use the dashboard: the operator, identified by the operator key of the stack's key ring.

Two ways to present the key, both checked against the same `KeyRing` as every gRPC server:
- `Authorization: Bearer <operator key>` (scripts, curl);
- the sign-in form (`/login`), which checks the key and sets a cookie holding a random session id (never
  the key: a copied cookie or a browser's cookie store must not leak a credential that works on every gRPC
  server). The key stays in this process's `Sessions`, keyed by that id; the cookie is HttpOnly (page
  scripts cannot read it), SameSite=Strict (other sites' pages cannot make the browser send it), Secure when
  served over HTTPS, scoped to this server. Signing out (`/logout`) revokes the session here, so a copy of
  the cookie stops working too; sessions expire after `SESSION_TTL_S`, and a key revoked from the ring ends
  every session made with it (the key is re-checked on every request).
Only the operator role is admitted: backend keys act for one tenant and the dashboard shows all of them;
service keys belong to processes, not people. A server without keys (loopback only) admits everyone as
ANONYMOUS, as the gRPC servers do.

State-changing requests (POST) additionally need the `x-apprentice-dashboard: 1` header, which a form or
link on another site cannot set without the server's CORS permission (never given), so a cookie alone
never causes an action.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from shared.security.identity import ANONYMOUS, Identity, Role
from shared.security.keys import KeyRing

COOKIE = "apprentice_dashboard"
ACTION_HEADER = "x-apprentice-dashboard"
SESSION_TTL_S = 12 * 3600.0
"""A sign-in lasts this long (also the cookie's max-age), then the operator signs in again."""
MAX_SESSIONS = 10_000
"""Sessions kept at most; the oldest go first, so sign-in floods cannot grow memory without bound."""


class NotSignedIn(Exception):
    """No usable credential: pages redirect to the sign-in form, the JSON API answers 401."""


class Forbidden(Exception):
    """A valid key of a role that may not use the dashboard (403)."""


@dataclass(frozen=True)
class Caller:
    identity: Identity
    token: str | None
    """The key the caller presented; operator actions are made with it (None without keys)."""


def check_token(keyring: KeyRing, token: str) -> Caller:
    identity = keyring.lookup_token(token)
    if identity is None:
        raise NotSignedIn("unknown or revoked key")
    if identity.role is not Role.OPERATOR:
        raise Forbidden(f"{identity.role.value} key {identity.key_id!r} may not use the dashboard: it is for "
                        f"operators (an operator key of APPRENTICE_AUTH_KEYS / APPRENTICE_AUTH_KEYS_FILE)")
    return Caller(identity, token)


class Sessions:
    """Signed-in browsers: random session id -> (operator key, expiry). In memory on purpose: a restart
    signs everyone out, and no key is ever written to disk or to a cookie."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, clock: Any = time.monotonic) -> None:
        self.ttl_s, self._clock = ttl_s, clock
        self._by_id: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def open(self, token: str) -> str:
        """A new session for `token`; its id (256 random bits) is what the cookie holds."""
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            for old in [k for k, (_, exp) in self._by_id.items() if exp <= now]:
                del self._by_id[old]
            while len(self._by_id) >= MAX_SESSIONS:
                del self._by_id[next(iter(self._by_id))]
            self._by_id[sid] = (token, now + self.ttl_s)
        return sid

    def token(self, sid: str) -> str | None:
        """The key behind a live session id, None for an unknown, revoked or expired one."""
        with self._lock:
            entry = self._by_id.get(sid)
            if entry is None:
                return None
            if entry[1] <= self._clock():
                del self._by_id[sid]
                return None
            return entry[0]

    def close(self, sid: str) -> None:
        """Revoke a session (sign-out): later requests with its cookie are not signed in."""
        with self._lock:
            self._by_id.pop(sid, None)


def authenticate(keyring: KeyRing, authorization: str, cookie: str, sessions: Sessions) -> Caller:
    """The caller behind a request's `Authorization` header or session cookie (a session id of `sessions`)."""
    if not keyring.enabled:
        return Caller(ANONYMOUS, None)
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotSignedIn("the `Authorization` header must be `Bearer <operator key>`")
        return check_token(keyring, token.strip())
    if cookie:
        session_token = sessions.token(cookie)
        if session_token is None:
            raise NotSignedIn("the session has ended (signed out or expired): sign in again")
        return check_token(keyring, session_token)
    raise NotSignedIn("sign in with an operator key")
