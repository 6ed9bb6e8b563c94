"""Key-ring text --> identities: parsing errors that name the entry (never the secret), lookups that compare
every entry, rotation through the watched file, and a broken file that keeps the last good keys."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest

from shared.security import keys
from shared.security.identity import Identity, Role
from shared.security.keys import KeyConfigError, KeyRing, parse_entries, read_secret

SECRET = "s3cret-s3cret-s3cret"
OTHER = "another-secret-value-0123"


def _touch_later(path: Path, text: str) -> None:
    """Write `text` and move the mtime forward, so a change within one clock tick is still seen."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


@pytest.mark.parametrize(("text", "needle"), [
    ("operator", "must look like"),
    ("operator:ops", "must look like"),
    ("admin:ops=" + SECRET, "role must be backend, operator or service, not 'admin'"),
    ("anonymous:x=" + SECRET, "`anonymous` is not a key role"),
    ("backend:shop=" + SECRET, "must name its tenant"),
    ("operator:ops@acme=" + SECRET, "acts for every tenant; drop `@acme`"),
    ("operator:ops=short", "at least 16 characters"),
    ("service:svc=sha256:abc", "64 hex digits"),
    ("service:svc=cert:", "needs a certificate name"),
    ("operator:-bad=" + SECRET, "must look like"),
])
def test_bad_entries_are_refused_with_a_precise_message(text: str, needle: str) -> None:
    with pytest.raises(KeyConfigError, match="APPRENTICE_AUTH_KEYS") as e:
        parse_entries(text, origin="APPRENTICE_AUTH_KEYS")
    assert needle in str(e.value)


def test_errors_never_echo_the_secret() -> None:
    for text in (f"admin:ops={SECRET}", f"operator:ops@acme={SECRET}", "operator:ops=tooshort-secret"):
        with pytest.raises(KeyConfigError) as e:
            parse_entries(text, origin="f")
        assert SECRET not in str(e.value) and "tooshort-secret" not in str(e.value)


def test_entries_parse_to_identities() -> None:
    digest = hashlib.sha256(OTHER.encode()).hexdigest()
    text = (f"# a comment\noperator:ops={SECRET}, backend:shop@acme=sha256:{digest.upper()}\n"
            f"service:trainer=cert:trainer.local  # trailing comment\n\n")
    entries = parse_entries(text, origin="t")
    assert [e.identity for e in entries] == [Identity("ops", Role.OPERATOR), Identity("shop", Role.BACKEND, "acme"),
                                             Identity("trainer", Role.SERVICE)]
    assert entries[1].digest == bytes.fromhex(digest) and entries[2].cert_name == "trainer.local"
    assert entries[2].digest == b""


def test_lookups() -> None:
    ring = KeyRing.from_text(f"operator:ops={SECRET},backend:shop@acme=sha256:"
                             f"{hashlib.sha256(OTHER.encode()).hexdigest()},service:t=cert:trainer.local")
    assert ring.enabled
    assert ring.lookup_token(SECRET) == Identity("ops", Role.OPERATOR)
    assert ring.lookup_token(OTHER) == Identity("shop", Role.BACKEND, "acme")
    for wrong in ("", SECRET[:-1], SECRET + "x", "trainer.local", "cert:trainer.local", "sha256:" + "0" * 64):
        assert ring.lookup_token(wrong) is None, wrong
    assert ring.lookup_cert(["trainer.local"]) == Identity("t", Role.SERVICE)
    assert ring.lookup_cert(["ops"]) is None and ring.lookup_cert([]) is None
    assert not KeyRing.from_text("").enabled


def test_lookup_compares_every_entry_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first entry matching must not end the scan early (timing would reveal the entry's position),
    and digests are compared with hmac.compare_digest."""
    ring = KeyRing.from_text(",".join(f"service:s{i}={SECRET}{i:04d}" for i in range(20)))
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(a)
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", counting)
    assert ring.lookup_token(f"{SECRET}0000") == Identity("s0", Role.SERVICE)
    assert len(calls) == 20
    calls.clear()
    assert ring.lookup_token("no-such-key-anywhere-at-all") is None and len(calls) == 20


def test_two_secrets_of_one_key_id_are_both_valid() -> None:
    ring = KeyRing.from_text(f"operator:ops={SECRET}\noperator:ops={OTHER}")
    assert ring.lookup_token(SECRET) == ring.lookup_token(OTHER) == Identity("ops", Role.OPERATOR)


def test_the_file_is_reread_when_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "RELOAD_EVERY_S", 0.0)
    f = tmp_path / "keys.txt"
    f.write_text(f"operator:ops={SECRET}\n")
    ring = KeyRing.from_text(f"service:env={OTHER}", file=f)
    assert ring.lookup_token(SECRET) is not None and ring.lookup_token(OTHER) is not None
    _touch_later(f, f"operator:ops={SECRET}\noperator:ops=rotated-secret-0123456789\n")
    assert ring.lookup_token("rotated-secret-0123456789") == Identity("ops", Role.OPERATOR)
    assert ring.lookup_token(SECRET) is not None
    _touch_later(f, "operator:ops=rotated-secret-0123456789\n")
    assert ring.lookup_token(SECRET) is None and ring.lookup_token("rotated-secret-0123456789") is not None
    assert ring.lookup_token(OTHER) is not None   # the environment's entries are fixed


def test_a_broken_file_keeps_the_last_good_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(keys, "RELOAD_EVERY_S", 0.0)
    f = tmp_path / "keys.txt"
    f.write_text(f"operator:ops={SECRET}\n")
    ring = KeyRing(file=f)
    _touch_later(f, "operator:ops=typo\n")
    assert ring.lookup_token(SECRET) == Identity("ops", Role.OPERATOR)
    assert "not reloaded" in caplog.text and SECRET not in caplog.text
    f.unlink()
    assert ring.lookup_token(SECRET) is not None   # a file being replaced: keep the keys


def test_the_reload_is_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "keys.txt"
    f.write_text(f"operator:ops={SECRET}\n")
    ring = KeyRing(file=f)
    ring.lookup_token(SECRET)
    now = keys.time.monotonic()
    monkeypatch.setattr(keys.time, "monotonic", lambda: now)
    _touch_later(f, f"operator:ops={OTHER}\n")
    assert ring.lookup_token(SECRET) is not None   # checked less than a second ago
    monkeypatch.setattr(keys.time, "monotonic", lambda: now + keys.RELOAD_EVERY_S + 0.01)
    assert ring.lookup_token(SECRET) is None and ring.lookup_token(OTHER) is not None


def test_a_missing_or_broken_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(KeyConfigError, match="cannot read key file"):
        KeyRing(file=tmp_path / "absent.txt")
    (tmp_path / "bad.txt").write_text("operator:ops=short\n")
    with pytest.raises(KeyConfigError, match="at least 16"):
        KeyRing(file=tmp_path / "bad.txt")


def test_read_secret(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("  from-file \n")
    assert read_secret(" from-env ", f) == "from-env"
    assert read_secret("", f) == "from-file"
    assert read_secret("", tmp_path / "absent") == "" and read_secret("", None) == ""
