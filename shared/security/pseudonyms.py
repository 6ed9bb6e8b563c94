"""(tenant, caller's session id) --> the session id every captured record carries: a keyed hash.

A session id is the caller's: the OpenAI `user` field becomes it when no `session_id` is sent
(services/inference/openai_api/schemas.py), and callers fill `user` with an e-mail address or an account
number, as OpenAI's documentation suggests. Kept verbatim it would reach the interactions topic (as the
record's field and its Kafka key), the capture spool, the graded topic and the extractor's trajectories,
all of which need only to group one session's turns. So they get `s1.<base32 of HMAC-SHA256(key,
"sid1|" + tenant + "|" + session id)[:16 bytes]>`: the same session always maps to the same pseudonym (on
every pod that shares the key), two tenants' equal ids do not meet, and without the key nobody can test a
guess ("is this jane@example.com's session?"), which an unkeyed hash of a low-entropy value would allow.

The key is the interaction-id secret (`APPRENTICE_INTERACTION_ID_SECRET` or `..._FILE`,
shared/settings.py), under its own domain prefix ("sid1|", the interaction-id MAC uses "iid1|"). Without
one (development), a random key of this process is used: pseudonyms then differ between pods and restarts,
but the raw value still never leaves the process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os

log = logging.getLogger(__name__)

PREFIX = "s1."
_TAG_BYTES = 16


class SessionPseudonyms:
    """Maps a tenant's session ids to their pseudonyms under one key (thread-safe: no state)."""

    def __init__(self, key: bytes) -> None:
        if not key:
            log.warning("no interaction-id secret: captured session ids are hashed with a random key of this "
                        "process (they differ between pods and restarts)")
            key = os.urandom(32)
        self._key = key

    def __call__(self, tenant: str, session_id: str) -> str:
        """The pseudonym of `session_id` within `tenant` ("" stays ""; an id that already is a pseudonym is
        hashed again like any other, so a caller cannot choose the pseudonym its records carry)."""
        if not session_id:
            return ""
        t = tenant.encode("utf-8", "surrogatepass")
        msg = b"sid1|" + len(t).to_bytes(4, "big") + t + b"|" + session_id.encode("utf-8", "surrogatepass")
        tag = hmac.new(self._key, msg, hashlib.sha256).digest()[:_TAG_BYTES]
        return PREFIX + base64.b32encode(tag).decode().rstrip("=").lower()
