"""(random id, tenant) --> an interaction id that proves which tenant it was issued to.

Feedback names an interaction by id, and a backend key may only send feedback on its own tenant's
interactions. Looking the interaction up would put a database on the feedback path; instead the id
carries a MAC: `<uuid4 hex>.<base32 of HMAC-SHA256(secret, "iid1|" + uuid + "|" + tenant)[:16 bytes]>`.
Anyone can read the tenant binding back by recomputing it; nobody without the secret can forge an id
for another tenant, or move one id to another tenant. The edge (inference) checks it; the grader checks
it again when it has the secret, because a feedback record may also reach Kafka from elsewhere.

The secret is `APPRENTICE_INTERACTION_ID_SECRET` (or `..._FILE`), shared by inference pods and graders;
without one, ids are unsigned (`<raw>`) and ownership cannot be checked (development only).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from datetime import UTC, datetime

_TAG_BYTES = 16


def _tag(secret: bytes, raw: str, tenant: str) -> str:
    mac = hmac.new(secret, f"iid1|{raw}|{tenant}".encode(), hashlib.sha256).digest()[:_TAG_BYTES]
    return base64.b32encode(mac).decode().rstrip("=").lower()


def new_raw(now_ms: int | None = None) -> str:
    """32 hex digits: 48-bit Unix milliseconds + 80 random bits (time-ordered, like a UUIDv7)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{ms & ((1 << 48) - 1):012x}{os.urandom(10).hex()}"


def issued_at(interaction_id: str) -> datetime | None:
    """When the id was issued (from its time prefix), or None for an id of another shape."""
    raw = interaction_id.partition(".")[0]
    if len(raw) != 32:
        return None
    try:
        return datetime.fromtimestamp(int(raw[:12], 16) / 1000, UTC)
    except ValueError:
        return None


def issue(tenant: str, secret: bytes, raw: str | None = None) -> str:
    """A new interaction id bound to `tenant` (unsigned when `secret` is empty)."""
    raw = raw or new_raw()
    return f"{raw}.{_tag(secret, raw, tenant)}" if secret else raw


def verify(interaction_id: str, tenant: str, secret: bytes) -> bool:
    """True when `interaction_id` was issued to `tenant` under `secret` (constant-time comparison)."""
    raw, dot, tag = interaction_id.partition(".")
    if not secret or not dot or not raw or not tag:
        return False
    # bytes, not str: compare_digest refuses non-ASCII strings, and a caller controls the tag
    return hmac.compare_digest(tag.encode("utf-8", "surrogatepass"), _tag(secret, raw, tenant).encode())


def is_signed(interaction_id: str) -> bool:
    return "." in interaction_id
