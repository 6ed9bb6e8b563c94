"""Kafka client security settings --> each client library's configuration (no broker here; the SASL
listener itself is exercised by tests/integration/test_kafka_sasl.py)."""

from __future__ import annotations

import datetime as dt
import ssl
import stat
from pathlib import Path

import faust
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from shared.contracts import topic_access as access
from shared.kafka.security import (
    PLAINTEXT,
    KafkaSecurity,
    faust_credentials,
    librdkafka_config,
)
from shared.settings import CommonSettings
from tools.broker.local_broker import BrokerError, LocalBroker

SECRET = "pw-LEAK-42"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BOOTSTRAP", "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD", "SASL_PASSWORD_FILE",
                 "SSL_CA", "SSL_CERT", "SSL_KEY"):
        monkeypatch.delenv(f"APPRENTICE_KAFKA_{name}", raising=False)
    monkeypatch.delenv("APPRENTICE_KAFKA_SECURITY_PROTOCOL", raising=False)


def _sasl_env(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("APPRENTICE_KAFKA_SASL_USERNAME", "svc")
    for k, v in extra.items():
        monkeypatch.setenv(f"APPRENTICE_KAFKA_{k.upper()}", v)


def _cert(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate (usable as a CA bundle and as a client certificate) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_plaintext_default_is_every_librarys_own_default() -> None:
    s = CommonSettings()
    assert s.kafka_security_protocol == "PLAINTEXT"
    assert librdkafka_config() == librdkafka_config(s) == {"security.protocol": "plaintext"}
    assert faust_credentials() is None


def test_sasl_scram_from_environment_reaches_every_client_library(monkeypatch: pytest.MonkeyPatch) -> None:
    _sasl_env(monkeypatch, sasl_password=SECRET, security_protocol="sasl_plaintext")  # case-insensitive
    assert librdkafka_config() == {"security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512",
                                   "sasl.username": "svc", "sasl.password": SECRET}
    creds = faust_credentials()
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username, creds.password) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-512", "svc", SECRET)
    assert SECRET not in repr(KafkaSecurity.from_settings(CommonSettings()))
    assert SECRET not in repr(CommonSettings())


def test_password_file_is_read_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    _sasl_env(monkeypatch, sasl_password_file=str(f), sasl_mechanism="scram-sha-256")
    assert librdkafka_config()["sasl.password"] == "from-file"          # one trailing newline dropped
    assert librdkafka_config()["sasl.mechanism"] == "SCRAM-SHA-256"
    monkeypatch.setenv("APPRENTICE_KAFKA_SASL_PASSWORD", "from-env")
    assert librdkafka_config()["sasl.password"] == "from-env"


@pytest.mark.parametrize(("env", "message"), [
    ({"SECURITY_PROTOCOL": "SASL_SSL", "SASL_PASSWORD": SECRET}, "needs APPRENTICE_KAFKA_SASL_USERNAME"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_USERNAME": "u"},
     "APPRENTICE_KAFKA_SASL_PASSWORD or APPRENTICE_KAFKA_SASL_PASSWORD_FILE"),
    ({"SASL_USERNAME": "u", "SASL_PASSWORD": SECRET}, "credentials are set but APPRENTICE_KAFKA_SECURITY_PROTOCOL"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_USERNAME": "u", "SASL_PASSWORD_FILE": "/nonexistent/pw"},
     "APPRENTICE_KAFKA_SASL_PASSWORD_FILE=/nonexistent/pw cannot be read"),
    ({"SECURITY_PROTOCOL": "TLS"}, "kafka_security_protocol"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_USERNAME": "u", "SASL_PASSWORD": SECRET,
      "SASL_MECHANISM": "GSSAPI"}, "kafka_sasl_mechanism"),
    ({"SSL_CA": "/etc/hostname"}, "APPRENTICE_KAFKA_SSL_CA is set but APPRENTICE_KAFKA_SECURITY_PROTOCOL=PLAINTEXT"),
    ({"SECURITY_PROTOCOL": "SSL", "SSL_CA": "/nonexistent/ca.pem"}, "APPRENTICE_KAFKA_SSL_CA=/nonexistent/ca.pem"),
])
def test_inconsistent_settings_name_the_variable_and_never_echo_the_secret(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(f"APPRENTICE_KAFKA_{k}", v)
    with pytest.raises(ValidationError, match=message) as e:
        CommonSettings()
    assert SECRET not in str(e.value)


def test_empty_password_file_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("\n")
    _sasl_env(monkeypatch, sasl_password_file=str(tmp_path / "pw"))
    with pytest.raises(ValidationError, match="is empty"):
        CommonSettings()


def test_empty_values_from_compose_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SASL_USERNAME", "SASL_PASSWORD", "SASL_PASSWORD_FILE", "SSL_CA", "SSL_CERT", "SSL_KEY"):
        monkeypatch.setenv(f"APPRENTICE_KAFKA_{name}", "")
    assert librdkafka_config() == {"security.protocol": "plaintext"}


def test_tls_and_mutual_tls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca, _ = _cert(tmp_path, "kafka-ca")
    cert, key = _cert(tmp_path, "client")
    monkeypatch.setenv("APPRENTICE_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("APPRENTICE_KAFKA_SSL_CA", str(ca))
    assert librdkafka_config() == {"security.protocol": "ssl", "ssl.ca.location": str(ca)}
    ctx = KafkaSecurity.from_settings(CommonSettings()).ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname   # verification is never relaxed
    assert any(c["subject"] == ((("commonName", "kafka-ca"),),) for c in ctx.get_ca_certs())
    assert isinstance(faust_credentials(), faust.SSLCredentials)

    monkeypatch.setenv("APPRENTICE_KAFKA_SSL_CERT", str(cert))
    with pytest.raises(ValidationError, match="both APPRENTICE_KAFKA_SSL_CERT and APPRENTICE_KAFKA_SSL_KEY"):
        CommonSettings()
    monkeypatch.setenv("APPRENTICE_KAFKA_SSL_KEY", str(key))
    assert librdkafka_config()["ssl.certificate.location"] == str(cert)
    assert librdkafka_config()["ssl.key.location"] == str(key)
    assert KafkaSecurity.from_settings(CommonSettings()).ssl_context() is not None  # load_cert_chain took the pair

    # SASL over TLS: faust gets SASL credentials carrying the TLS context
    _sasl_env(monkeypatch, security_protocol="SASL_SSL", sasl_password=SECRET)
    creds = faust_credentials()
    assert isinstance(creds, faust.SASLCredentials) and creds.protocol.value == "SASL_SSL"
    assert librdkafka_config()["security.protocol"] == "sasl_ssl"


def test_explicit_security_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _sasl_env(monkeypatch, sasl_password=SECRET)
    assert librdkafka_config(PLAINTEXT) == {"security.protocol": "plaintext"}
    assert librdkafka_config(CommonSettings(kafka_security_protocol="PLAINTEXT", kafka_sasl_username=None,
                                            kafka_sasl_password=None)) == {"security.protocol": "plaintext"}


def test_local_broker_passwords_are_generated_private_and_stable(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path, port=29192, controller_port=29193)
    pw = b.password(access.GRADER)
    assert len(pw) >= 40 and b.password(access.GRADER) == pw and b.password(access.TRAINER) != pw
    f = b.password_file(access.GRADER)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and stat.S_IMODE(f.parent.stat().st_mode) == 0o700
    assert LocalBroker(tmp_path).password(access.GRADER) == pw                      # read back
    assert LocalBroker(tmp_path / "other").password(access.GRADER) != pw
    env = b.client_env(access.GRADER)
    assert env["APPRENTICE_KAFKA_BOOTSTRAP"] == "127.0.0.1:29192"
    assert env["APPRENTICE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert env["APPRENTICE_KAFKA_SASL_PASSWORD_FILE"] == str(f.resolve())
    assert b.client_env(access.ADMIN)["APPRENTICE_KAFKA_SASL_MECHANISM"] == "PLAIN"
    b.rotate(access.ADMIN)   # the admin's password is the broker's JAAS line: no broker needed to rotate it
    assert b.password(access.ADMIN) != LocalBroker(tmp_path / "other").password(access.ADMIN)


def test_local_broker_config_is_sasl_only_and_authorizing(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path, port=29192, controller_port=29193)
    props = b._properties()
    text = props.read_text()
    assert stat.S_IMODE(props.stat().st_mode) == 0o600          # it holds the admin's password
    assert "listeners=SASL_PLAINTEXT://127.0.0.1:29192,CONTROLLER://127.0.0.1:29193" in text
    assert "PLAINTEXT://" not in text.replace("SASL_PLAINTEXT://", "")
    assert "CONTROLLER:SASL_PLAINTEXT" in text and "sasl.mechanism.controller.protocol=PLAIN" in text
    assert "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer" in text
    assert "allow.everyone.if.no.acl.found=false" in text and "super.users=User:admin" in text
    assert b.password(access.GRADER) not in text                 # the principals' passwords live as SCRAM hashes
    insecure = LocalBroker(tmp_path, port=29192, controller_port=29193, plaintext_port=29195)
    assert "PLAINTEXT://127.0.0.1:29195" in "\n".join(insecure.properties())


def test_local_broker_for_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPRENTICE_HOME", str(tmp_path))
    b = LocalBroker.for_settings(CommonSettings())
    assert (b.port, b.controller_port, b.plaintext_port) == (9092, 9093, None)
    assert LocalBroker.for_settings(CommonSettings(), plaintext_port=9095).plaintext_port == 9095
    _sasl_env(monkeypatch, sasl_password=SECRET, bootstrap="127.0.0.1:29092")
    assert LocalBroker.for_settings(CommonSettings()).port == 29092     # the SASL listener is the bootstrap
    monkeypatch.setenv("APPRENTICE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(BrokerError, match="not SASL_SSL"):
        LocalBroker.for_settings(CommonSettings())
    with pytest.raises(BrokerError, match="already the broker's SASL"):
        LocalBroker(tmp_path, port=9092, plaintext_port=9092)
