"""Who wrote a record: an Ed25519 signature on every record, checked by every consumer before decoding.

Why signatures and not the broker's ACLs alone (SECURITY.md section 4): an attacker who reaches the broker
(a stolen consumer credential, a misconfigured ACL, a broker-level compromise) can write any bytes to any
topic it can reach. A record is only accepted when it carries a valid signature by a principal allowed to
write that topic (`shared/contracts/topic_access.py` `writers_of`).

Why asymmetric (Ed25519) and not a shared MAC: a verifier holds only public keys. The grader verifies
inference's feedback; with a MAC the grader's key would let it (or whoever steals it) forge feedback as
inference. With one key pair per principal, a stolen key forges only its own principal's records.

What is signed: a canonical, length-prefixed encoding of (contract topic name, key, value, the record-type
header, signer, signed-at). Binding the contract topic name (not the deployment's prefixed name) stops a
record signed for one topic from being copied to another; length prefixes make the encoding unambiguous
(no two different tuples encode to the same bytes).

Keys live in one directory (`APPRENTICE_RECORD_KEYS_DIR`): `<principal>.key` is the principal's private key
(PEM, PKCS8, mode 0600; a pod mounts only its own) and `<principal>@<key_id>.pub` are the public keys of all
principals (raw 32 bytes, hex). `key_id` is derived from the public key (first 16 hex digits of its SHA-256),
so several keys per principal can be trusted at once while a key is rotated: write a new pair, ship the new
`.pub` to every consumer, switch the producer's `.key`, then delete the old `.pub` once its records are
past every consumer's retention.

Replays: the verifier remembers the signatures it accepted (bounded, see `RecordVerifier.replay_window`);
the same signature at another (topic, partition, offset) is a replay. Consumers whose state a replay could
move backwards (model updates, knowledge snapshots) also refuse any version not newer than the current one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shared.contracts.topic_access import writers_of
from shared.contracts.validation import TYPE_HEADER  # the record-type header the signature also covers

log = logging.getLogger(__name__)

SIGNER_HEADER = "apprentice-signer"
"""`<principal>:<key_id>`."""
SIGNED_AT_HEADER = "apprentice-signed-at"
"""Milliseconds since the epoch, decimal ASCII."""
SIGNATURE_HEADER = "apprentice-signature"
"""64 raw bytes of Ed25519 signature."""

SIGNING_HEADERS = frozenset({SIGNER_HEADER, SIGNED_AT_HEADER, SIGNATURE_HEADER})

Headers = Sequence[tuple[str, bytes | str | None]]

_ENCODING_VERSION = b"apprentice-record-v1"


class SigningKeyMissing(RuntimeError):
    """The service is in required mode and its private key is not in the keys directory."""


def key_id_of(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _field(data: bytes | None) -> bytes:
    # None (an absent key or header) is distinct from b"": flag byte then length
    if data is None:
        return b"\x00"
    return b"\x01" + struct.pack(">I", len(data)) + data


def _as_bytes(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def canonical(topic: str, key: bytes | None, value: bytes | None, record_type: bytes | None,
              signer: str, signed_at_ms: int) -> bytes:
    """The exact bytes signed: every field length-prefixed, so no two tuples share an encoding."""
    return b"".join((
        _field(_ENCODING_VERSION), _field(topic.encode()), _field(key), _field(value), _field(record_type),
        _field(signer.encode()), _field(str(signed_at_ms).encode()),
    ))


def header(headers: Headers | None, name: str) -> bytes | None:
    """The last value of header `name` (a later header wins, as Kafka clients read them)."""
    found: bytes | None = None
    for k, v in headers or ():
        if k == name:
            found = _as_bytes(v)
    return found


def sign(private: Ed25519PrivateKey, principal: str, topic: str, key: bytes | str | None,
         value: bytes | None, headers: Headers | None = None, *, now_ms: int | None = None
         ) -> list[tuple[str, bytes]]:
    """The three signing headers for a record of contract topic `topic` (append them to its headers)."""
    signer = f"{principal}:{key_id_of(private.public_key())}"
    signed_at = int(time.time() * 1000) if now_ms is None else now_ms
    sig = private.sign(canonical(topic, _as_bytes(key), value, header(headers, TYPE_HEADER), signer, signed_at))
    return [(SIGNER_HEADER, signer.encode()), (SIGNED_AT_HEADER, str(signed_at).encode()),
            (SIGNATURE_HEADER, sig)]


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one record: `ok`, or the refusal's reason (dead-letter reason text)."""

    ok: bool
    reason: str = ""
    principal: str = ""
    signed_at_ms: int = 0
    signature: bytes = b""


def _refuse(reason: str, principal: str = "") -> Verdict:
    return Verdict(False, reason, principal)


class KeyRing:
    """The public keys of every principal, by (principal, key_id), read from the keys directory."""

    def __init__(self, keys: dict[tuple[str, str], Ed25519PublicKey]) -> None:
        self._keys = dict(keys)

    @classmethod
    def load(cls, directory: Path) -> KeyRing:
        keys: dict[tuple[str, str], Ed25519PublicKey] = {}
        for path in sorted(directory.glob("*@*.pub")):
            principal = path.name.split("@", 1)[0]
            pub = Ed25519PublicKey.from_public_bytes(bytes.fromhex(path.read_text().strip()))
            keys[(principal, key_id_of(pub))] = pub
        return cls(keys)

    def get(self, principal: str, key_id: str) -> Ed25519PublicKey | None:
        return self._keys.get((principal, key_id))


def verify(ring: KeyRing, topic: str, key: bytes | str | None, value: bytes | None,
           headers: Headers | None) -> Verdict:
    """Check signer, permission and signature of a record read from contract topic `topic`.

    The permission check comes first and uses the claimed signer only to pick the key: a record whose
    signer may not write `topic` is refused whatever its signature.
    """
    signer_b = header(headers, SIGNER_HEADER)
    sig = header(headers, SIGNATURE_HEADER)
    at_b = header(headers, SIGNED_AT_HEADER)
    if signer_b is None or sig is None or at_b is None:
        return _refuse("unsigned")
    try:
        signer = signer_b.decode()
        signed_at = int(at_b.decode())
    except (UnicodeDecodeError, ValueError):
        return _refuse("bad signature")
    principal, _, key_id = signer.partition(":")
    try:
        allowed = writers_of(topic)
    except KeyError:
        allowed = frozenset()
    if principal not in allowed:
        return _refuse(f"signer {principal} may not write {topic}", principal)
    pub = ring.get(principal, key_id)
    if pub is None:
        return _refuse(f"bad signature (unknown key {signer})", principal)
    try:
        pub.verify(sig, canonical(topic, _as_bytes(key), value, header(headers, TYPE_HEADER), signer, signed_at))
    except InvalidSignature:
        return _refuse("bad signature", principal)
    return Verdict(True, "", principal, signed_at, sig)


class RecordSigner:
    """Signs every record one principal produces."""

    def __init__(self, principal: str, private: Ed25519PrivateKey) -> None:
        self.principal = principal
        self._private = private

    @property
    def key_id(self) -> str:
        """The id of this signer's key, as in its `<principal>@<key_id>.pub` file."""
        return key_id_of(self._private.public_key())

    def headers(self, topic: str, key: bytes | str | None, value: bytes | None,
                headers: Headers | None = None) -> list[tuple[str, bytes]]:
        """`headers` (type header included) with the signing headers appended, any stale ones dropped."""
        kept = [(k, _as_bytes(v) or b"") for k, v in headers or () if k not in SIGNING_HEADERS]
        return kept + sign(self._private, self.principal, topic, key, value, kept)


class RecordVerifier:
    """Checks records of one consumer and remembers accepted signatures to refuse replays.

    `replay_window` signatures are remembered (oldest forgotten first): a record re-sent after that many
    newer records is caught only by the consumer's own state checks (versions, ids joined once).
    """

    def __init__(self, ring: KeyRing, *, replay_window: int = 100_000) -> None:
        self.ring = ring
        self.replay_window = replay_window
        self._seen: OrderedDict[bytes, tuple[str, int, int]] = OrderedDict()

    def check(self, topic: str, key: bytes | str | None, value: bytes | None, headers: Headers | None,
              *, where: tuple[str, int, int] | None = None) -> Verdict:
        """Verdict for one record; `where` = (topic, partition, offset) enables replay detection."""
        verdict = verify(self.ring, topic, key, value, headers)
        if not verdict.ok or where is None:
            return verdict
        first = self._seen.get(verdict.signature)
        if first is not None and first != where:
            return Verdict(False, "replay", verdict.principal, verdict.signed_at_ms, verdict.signature)
        self._seen[verdict.signature] = where
        self._seen.move_to_end(verdict.signature)
        while len(self._seen) > self.replay_window:
            self._seen.popitem(last=False)
        return verdict


# --- keys on disk ------------------------------------------------------------------------------------


def private_key_path(directory: Path, principal: str) -> Path:
    return directory / f"{principal}.key"


def load_signer(directory: Path, principal: str) -> RecordSigner:
    """The principal's signer; SigningKeyMissing naming the setting when its key is absent."""
    path = private_key_path(directory, principal)
    try:
        pem = path.read_bytes()
    except FileNotFoundError:
        raise SigningKeyMissing(
            f"no record signing key for {principal!r} at {path}: set APPRENTICE_RECORD_KEYS_DIR to a "
            "directory holding it (apprentice keys records init writes one)") from None
    private = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyMissing(f"{path} is not an Ed25519 private key")
    return RecordSigner(principal, private)


def init_keys(directory: Path, principals: Iterable[str]) -> list[str]:
    """Write a key pair for each principal that has no private key yet; the principals written."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    written: list[str] = []
    for principal in principals:
        path = private_key_path(directory, principal)
        if path.exists():
            continue
        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        pub = private.public_key()
        raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        (directory / f"{principal}@{key_id_of(pub)}.pub").write_text(raw.hex() + "\n")
        written.append(principal)
    return written
