"""Record signatures (shared/kafka/signing.py): a hand-checked case, and every tampered field refused."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.contracts import topics as t
from shared.kafka import signing as s

# a fixed seed, so the hand-checked signer string below stays the same run to run
_SEED = bytes(range(32))


@pytest.fixture
def grader_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_SEED)


@pytest.fixture
def ring(grader_key: Ed25519PrivateKey) -> s.KeyRing:
    pub = grader_key.public_key()
    return s.KeyRing({("grader", s.key_id_of(pub)): pub})


def _signed(key: Ed25519PrivateKey, principal: str = "grader", topic: str = t.GRADED) -> list[tuple[str, bytes]]:
    base = [(s.TYPE_HEADER, b"apprentice.GradedInteraction")]
    return base + s.sign(key, principal, topic, b"k1", b"value", base, now_ms=1_700_000_000_000)


def test_canonical_is_length_prefixed() -> None:
    # ("ab", "c") and ("a", "bc") must not encode alike; None differs from b""
    a = s.canonical("t", b"ab", b"c", None, "p", 1)
    b = s.canonical("t", b"a", b"bc", None, "p", 1)
    c = s.canonical("t", b"", b"abc", None, "p", 1)
    d = s.canonical("t", None, b"abc", None, "p", 1)
    assert len({a, b, c, d}) == 4


def test_hand_checked_case(grader_key: Ed25519PrivateKey, ring: s.KeyRing) -> None:
    headers = _signed(grader_key)
    signer = s.header(headers, s.SIGNER_HEADER)
    assert signer == f"grader:{s.key_id_of(grader_key.public_key())}".encode()
    assert s.header(headers, s.SIGNED_AT_HEADER) == b"1700000000000"
    sig = s.header(headers, s.SIGNATURE_HEADER)
    assert sig is not None and len(sig) == 64
    # the signature is over exactly the documented encoding
    grader_key.public_key().verify(sig, s.canonical(
        t.GRADED, b"k1", b"value", b"apprentice.GradedInteraction", signer.decode(), 1_700_000_000_000))
    verdict = s.verify(ring, t.GRADED, b"k1", b"value", headers)
    assert verdict.ok and verdict.principal == "grader"


@pytest.mark.parametrize("field", ["key", "value", "type", "topic", "signed_at"])
def test_one_byte_changed_is_refused(field: str, grader_key: Ed25519PrivateKey, ring: s.KeyRing) -> None:
    headers = _signed(grader_key)
    key, value, topic = b"k1", b"value", t.GRADED
    if field == "key":
        key = b"k2"
    elif field == "value":
        value = b"valuf"
    elif field == "type":
        headers = [(k, b"apprentice.GradedInteractioN" if k == s.TYPE_HEADER else v) for k, v in headers]
    elif field == "topic":
        topic = t.INTERACTIONS  # a graded record copied to another topic
    else:
        headers = [(k, b"1700000000001" if k == s.SIGNED_AT_HEADER else v) for k, v in headers]
    verdict = s.verify(ring, topic, key, value, headers)
    assert not verdict.ok
    assert verdict.reason in {"bad signature", f"signer grader may not write {topic}"}


def test_unsigned_and_wrong_principal(grader_key: Ed25519PrivateKey, ring: s.KeyRing) -> None:
    assert s.verify(ring, t.GRADED, b"k1", b"value", []).reason == "unsigned"
    # a trainer key on a graded record: refused by the table before any key lookup
    trainer = Ed25519PrivateKey.generate()
    verdict = s.verify(ring, t.GRADED, b"k1", b"value", _signed(trainer, "trainer"))
    assert verdict.reason == f"signer trainer may not write {t.GRADED}"
    # a key claiming "grader" that is not in the ring
    verdict = s.verify(ring, t.GRADED, b"k1", b"value", _signed(Ed25519PrivateKey.generate()))
    assert not verdict.ok and verdict.reason.startswith("bad signature")


def test_replay_at_another_offset(grader_key: Ed25519PrivateKey, ring: s.KeyRing) -> None:
    verifier = s.RecordVerifier(ring)
    headers = _signed(grader_key)
    assert verifier.check(t.GRADED, b"k1", b"value", headers, where=("g", 0, 5)).ok
    # the same record read again at its own offset (a consumer restart) is not a replay
    assert verifier.check(t.GRADED, b"k1", b"value", headers, where=("g", 0, 5)).ok
    assert verifier.check(t.GRADED, b"k1", b"value", headers, where=("g", 0, 9)).reason == "replay"


def test_init_keys_and_load(tmp_path: Path) -> None:
    assert s.init_keys(tmp_path, ["grader", "operator"]) == ["grader", "operator"]
    assert s.init_keys(tmp_path, ["grader"]) == []  # existing keys are kept
    assert stat.S_IMODE((tmp_path / "grader.key").stat().st_mode) == 0o600
    signer = s.load_signer(tmp_path, "operator")
    headers = signer.headers(t.GRADER_RULES, None, b"rules")
    assert s.verify(s.KeyRing.load(tmp_path), t.GRADER_RULES, None, b"rules", headers).ok
    with pytest.raises(s.SigningKeyMissing, match="APPRENTICE_RECORD_KEYS_DIR"):
        s.load_signer(tmp_path, "weights")


def test_tool_writes_a_pair_per_writer(tmp_path: Path) -> None:
    from tools.record_keys import SIGNERS, ensure

    assert set(SIGNERS) == {"inference", "grader", "extractor", "trainer", "weights", "operator"}
    assert ensure(tmp_path) == list(SIGNERS)
    ring = s.KeyRing.load(tmp_path)
    for principal in SIGNERS:
        signer = s.load_signer(tmp_path, principal)
        pub = ring.get(principal, signer.key_id)
        assert pub is not None
