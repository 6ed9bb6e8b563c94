"""Credential text (environment variable and/or mounted file) --> the identities a server accepts.

Format: one entry per line (file) or separated by commas/newlines (environment), `#` starts a comment:

    <role>:<key_id>[@<tenant>]=<credential>

- role: `backend` (needs `@tenant`), `operator` or `service`;
- credential: the secret itself (at least 16 characters), `sha256:<64 hex>` (the secret's SHA-256, so a
  mounted file need not hold the secret), or `cert:<common name>` (a client certificate verified by the
  server's CA under mutual TLS maps to this identity; never usable as a bearer token).

Rotation: two entries with the same key id and different secrets are both valid; the file is re-read
when it changes (checked at most once a second), so a new key can be added and the old one removed
without a restart. A file that fails to parse after a change keeps the last good ring (logged), so a
typo never locks every caller out.

Lookups hash the presented token and compare it with every entry's digest using `hmac.compare_digest`,
without stopping at the first match, so timing does not reveal which entry (or how much of one) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from shared.security.identity import Identity, Role

log = logging.getLogger(__name__)

MIN_SECRET_CHARS = 16
_ENTRY_RE = re.compile(r"^(?P<role>[a-z]+):(?P<key_id>[A-Za-z0-9][A-Za-z0-9._-]{0,127})"
                       r"(?:@(?P<tenant>[A-Za-z0-9][A-Za-z0-9._-]{0,127}))?=(?P<cred>.+)$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
RELOAD_EVERY_S = 1.0


class KeyConfigError(ValueError):
    """The key configuration cannot be used; the message says which entry and what to change."""


@dataclass(frozen=True)
class KeyEntry:
    identity: Identity
    digest: bytes = b""
    """SHA-256 of the bearer secret; empty for certificate entries."""
    cert_name: str = ""


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_entries(text: str, *, origin: str) -> list[KeyEntry]:
    """Parse key entries; raise KeyConfigError naming `origin` and the entry's position (never the secret)."""
    out: list[KeyEntry] = []
    items = [s.strip() for line in text.splitlines() for s in line.split("#", 1)[0].split(",")]
    for n, item in enumerate((i for i in items if i), start=1):
        m = _ENTRY_RE.match(item)
        if not m:
            raise KeyConfigError(f"{origin}: entry {n} must look like `<role>:<key_id>[@<tenant>]=<secret>` "
                                 f"(got {item.split('=', 1)[0]!r}=...)")
        try:
            role = Role(m["role"])
        except ValueError:
            raise KeyConfigError(f"{origin}: entry {n} ({m['key_id']}): role must be backend, operator or "
                                 f"service, not {m['role']!r}") from None
        if role is Role.ANONYMOUS:
            raise KeyConfigError(f"{origin}: entry {n} ({m['key_id']}): `anonymous` is not a key role")
        tenant = m["tenant"] or ""
        if role is Role.BACKEND and not tenant:
            raise KeyConfigError(f"{origin}: backend key {m['key_id']!r} must name its tenant: "
                                 f"backend:{m['key_id']}@<tenant>=<secret>")
        if role is not Role.BACKEND and tenant:
            raise KeyConfigError(f"{origin}: {role} key {m['key_id']!r} acts for every tenant; drop `@{tenant}`")
        identity = Identity(key_id=m["key_id"], role=role, tenant=tenant)
        cred = m["cred"].strip()
        if cred.startswith("cert:"):
            name = cred[5:].strip()
            if not name:
                raise KeyConfigError(f"{origin}: entry {n} ({m['key_id']}): `cert:` needs a certificate name")
            out.append(KeyEntry(identity, cert_name=name))
        elif cred.startswith("sha256:"):
            hexd = cred[7:].strip().lower()
            if not _HEX64.match(hexd):
                raise KeyConfigError(f"{origin}: entry {n} ({m['key_id']}): `sha256:` needs 64 hex digits")
            out.append(KeyEntry(identity, digest=bytes.fromhex(hexd)))
        else:
            if len(cred) < MIN_SECRET_CHARS:
                raise KeyConfigError(f"{origin}: entry {n} ({m['key_id']}): secrets need at least "
                                     f"{MIN_SECRET_CHARS} characters (use a random token, e.g. "
                                     f"`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
            out.append(KeyEntry(identity, digest=_digest(cred)))
    return out


class KeyRing:
    """The accepted credentials of one server: fixed entries (environment) plus a watched file."""

    def __init__(self, entries: list[KeyEntry] | None = None, *, file: Path | None = None) -> None:
        self._fixed = list(entries or [])
        self._file = file
        self._file_entries: list[KeyEntry] = []
        self._file_sig: tuple[int, int] | None = None
        self._checked_at = 0.0
        self._lock = threading.Lock()
        if file is not None:
            self._load_file(strict=True)

    @classmethod
    def from_text(cls, text: str = "", *, file: Path | None = None, origin: str = "APPRENTICE_AUTH_KEYS",
                  extra: list[KeyEntry] | None = None) -> KeyRing:
        return cls(parse_entries(text, origin=origin) + list(extra or []), file=file)

    # --- file watching ----------------------------------------------------------------------------
    def _load_file(self, *, strict: bool) -> None:
        assert self._file is not None, "no key file configured"
        try:
            st = self._file.stat()
            sig = (st.st_mtime_ns, st.st_size)
            if sig == self._file_sig:
                return
            entries = parse_entries(self._file.read_text(), origin=str(self._file))
        except (OSError, KeyConfigError) as e:
            if strict:
                raise KeyConfigError(f"cannot read key file {self._file}: {e}") from e
            log.error("key file %s not reloaded, keeping the previous keys: %s", self._file, e)
            return
        if self._file_sig is not None:
            log.info("key file %s reloaded: %d entries", self._file, len(entries))
        self._file_entries, self._file_sig = entries, sig

    def _entries(self) -> list[KeyEntry]:
        if self._file is not None:
            now = time.monotonic()
            if now - self._checked_at >= RELOAD_EVERY_S:
                with self._lock:
                    if now - self._checked_at >= RELOAD_EVERY_S:
                        self._checked_at = now
                        self._load_file(strict=False)
        return self._fixed + self._file_entries

    def entries(self) -> list[KeyEntry]:
        """Every accepted entry now (the file re-read when it changed): the grader checks operator
        signatures on runtime rules against the operator entries' digests."""
        return self._entries()

    # --- lookups ----------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """True when any credential is configured: then every call must authenticate."""
        return bool(self._fixed) or self._file is not None

    def lookup_token(self, token: str) -> Identity | None:
        """The identity of a bearer token, compared in constant time against every entry."""
        if not token:
            return None
        given = _digest(token)
        found: Identity | None = None
        for e in self._entries():
            if e.digest and hmac.compare_digest(e.digest, given) and found is None:
                found = e.identity
        return found

    def lookup_cert(self, common_names: list[str]) -> Identity | None:
        """The identity mapped to a verified client certificate's subject or SAN names."""
        for e in self._entries():
            if e.cert_name and e.cert_name in common_names:
                return e.identity
        return None


def read_secret(value: str, file: Path | None) -> str:
    """A secret from an environment value or, when that is empty, a mounted file (re-read on every call,
    so a rotated file is picked up); whitespace around it is dropped."""
    if value:
        return value.strip()
    if file is not None and file.exists():
        return file.read_text().strip()
    return ""
