"""Development credentials: the certificates verify against their CA (and not another), files are private,
the keys file parses into the expected identities, and a second run reuses everything."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.security.identity import Identity, Role
from shared.security.keys import KeyRing
from tools.devca import OPERATOR_ID, SERVICE_ID, ensure_dev_credentials, issue_cert, make_ca


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):  # noqa: BLE001 - InvalidSignature and friends
        return False
    return True


def test_certificates_verify_against_their_ca_only(tmp_path: Path) -> None:
    creds = ensure_dev_credentials(tmp_path, tenants=("acme",))
    ca, server = _cert(creds.ca), _cert(creds.server_cert)
    assert _signed_by(server, ca) and _signed_by(ca, ca)
    other_pem, _ = make_ca(tmp_path / "other")
    assert not _signed_by(server, _cert(other_pem))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert {"127.0.0.1", "::1"} <= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku and not server.extensions.get_extension_for_class(
        x509.BasicConstraints).value.ca
    assert isinstance(server.public_key(), ec.EllipticCurvePublicKey)


def test_client_certificates(tmp_path: Path) -> None:
    ca_pem, ca_key = make_ca(tmp_path)
    cert_path, key_path = issue_cert(ca_pem, ca_key, tmp_path / "client-trainer", "trainer.local", server=False)
    cert = _cert(cert_path)
    assert _signed_by(cert, _cert(ca_pem)) and key_path.exists()
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "trainer.local"
    assert ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value


def test_files_are_private_and_the_ring_has_every_caller(tmp_path: Path) -> None:
    creds = ensure_dev_credentials(tmp_path, tenants=("acme", "globex"))
    assert stat.S_IMODE(creds.directory.stat().st_mode) == 0o700
    for f in creds.directory.iterdir():
        if f.is_dir():      # scrape/: the metrics key alone, readable by a scraper of another user
            assert sorted(p.name for p in f.iterdir()) == ["metrics.token"], f
            continue
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    ring = KeyRing(file=creds.keys_file)
    assert ring.lookup_token(creds.token(creds.operator_token)) == Identity(OPERATOR_ID, Role.OPERATOR)
    assert ring.lookup_token(creds.token(creds.service_token)) == Identity(SERVICE_ID, Role.SERVICE)
    for t in ("acme", "globex"):
        assert ring.lookup_token(creds.token(creds.backend_token(t))) == Identity(f"{t}-backend", Role.BACKEND, t)
    tokens = [creds.token(p) for p in (creds.operator_token, creds.service_token, creds.backend_token("acme"),
                                        creds.interaction_id_secret)]
    assert len(set(tokens)) == len(tokens) and all(len(t) >= 32 for t in tokens)
    env = creds.service_env()
    assert env["APPRENTICE_TLS_CA"] == str(creds.ca) and env["APPRENTICE_AUTH_KEYS_FILE"] == str(creds.keys_file)
    assert creds.client_env()["APPRENTICE_AUTH_TOKEN_FILE"] == str(creds.operator_token)


def test_a_second_run_reuses_credentials_and_adds_new_tenants(tmp_path: Path) -> None:
    first = ensure_dev_credentials(tmp_path, tenants=("acme",))
    before = {p.name: p.read_bytes() for p in first.directory.iterdir() if p.is_file()}
    again = ensure_dev_credentials(tmp_path, tenants=("acme", "globex"))
    after = {p.name: p.read_bytes() for p in again.directory.iterdir() if p.is_file()}
    for name, data in before.items():
        if name != "keys.txt":
            assert after[name] == data, name
    assert before["keys.txt"] in after["keys.txt"] and b"backend:globex-backend@globex=" in after["keys.txt"]
    assert after["keys.txt"].count(b"operator:") == 1


@pytest.mark.parametrize("missing", ["server.pem", "keys.txt", "interaction-id.secret"])
def test_a_missing_file_is_recreated(tmp_path: Path, missing: str) -> None:
    creds = ensure_dev_credentials(tmp_path, tenants=("acme",))
    ca = creds.ca.read_bytes()
    (creds.directory / missing).unlink()
    ensure_dev_credentials(tmp_path, tenants=("acme",))
    assert (creds.directory / missing).exists() and creds.ca.read_bytes() == ca
    if missing == "server.pem":
        assert _signed_by(_cert(creds.server_cert), _cert(creds.ca))
