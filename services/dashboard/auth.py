"""Who may use the dashboard: the operator, identified by the operator key of the stack's key ring.

Two ways to present the key, both checked against the same `KeyRing` as every gRPC server:
- `Authorization: Bearer <operator key>` (scripts, curl);
- the sign-in form (`/login`), which sets a cookie holding the key: HttpOnly (page scripts cannot read
  it), SameSite=Strict (other sites' pages cannot make the browser send it), Secure when served over
  HTTPS, scoped to this server. Signing out (`/logout`) clears it.
Only the operator role is admitted: backend keys act for one tenant and the dashboard shows all of them;
service keys belong to processes, not people. A server without keys (loopback only) admits everyone as
ANONYMOUS, as the gRPC servers do.

State-changing requests (POST) additionally need the `x-apprentice-dashboard: 1` header, which a form or
link on another site cannot set without the server's CORS permission (never given), so a cookie alone
never causes an action.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.security.identity import ANONYMOUS, Identity, Role
from shared.security.keys import KeyRing

COOKIE = "apprentice_dashboard"
ACTION_HEADER = "x-apprentice-dashboard"


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


def authenticate(keyring: KeyRing, authorization: str, cookie: str) -> Caller:
    """The caller behind a request's `Authorization` header or session cookie."""
    if not keyring.enabled:
        return Caller(ANONYMOUS, None)
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotSignedIn("the `Authorization` header must be `Bearer <operator key>`")
        return check_token(keyring, token.strip())
    if cookie:
        return check_token(keyring, cookie)
    raise NotSignedIn("sign in with an operator key")
