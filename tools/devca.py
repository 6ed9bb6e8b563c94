"""A stack's home --> its development CA, server certificate, keys and secrets (created once, reused).

`apprentice up`, the demo and the tests run with authentication and TLS on, without a manual step: the
first start writes under `<home>/secrets/` (directory 0700, files 0600):
- `ca.pem`/`ca.key`: a private CA (EC P-256, 2 years) that only this stack trusts;
- `server.pem`/`server.key`: the certificate every local gRPC server presents (localhost, 127.0.0.1, ::1);
- `client-<name>.pem/.key`: client certificates for mutual TLS (optional);
- `keys.txt`: the key ring every server accepts (an operator, the services, a metrics scraper, one backend
  key per tenant);
- `operator.token`, `service.token`, `metrics.token`, `backend-<tenant>.token`: each caller's key, to mount
  or export;
- `interaction-id.secret`: the MAC key of interaction ids.
These are for one machine's local stack; production mounts its own secrets with the same settings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.contracts.dev_credentials import DevCredentials
from shared.settings import default_home

VALID_DAYS = 730
SERVER_HOSTS = ("localhost", "127.0.0.1", "::1", "inference", "weights", "extractor")
"""Names the development server certificate is valid for: loopback, and the compose file's service names."""
OPERATOR_ID = "local-operator"
SERVICE_ID = "local-services"
METRICS_ID = "local-metrics"


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: Path, name: str = "Apprentice development CA") -> tuple[Path, Path]:
    """Write `ca.pem` and `ca.key` into `directory`; return their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "ca.key", _key_pem(key))
    _write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    return directory / "ca.pem", directory / "ca.key"


def issue_cert(ca_pem: Path, ca_key: Path, out_prefix: Path, common_name: str, *, server: bool,
               hosts: tuple[str, ...] = SERVER_HOSTS) -> tuple[Path, Path]:
    """Sign a server (with `hosts` as SANs) or client certificate; write `<prefix>.pem` and `<prefix>.key`."""
    ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    ca_priv = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    assert isinstance(ca_priv, ec.EllipticCurvePrivateKey), "the development CA key is an EC key"
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(common_name)]
    if server:
        sans = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_priv, hashes.SHA256()))
    _write(out_prefix.with_suffix(".key"), _key_pem(key))
    _write(out_prefix.with_suffix(".pem"), cert.public_bytes(serialization.Encoding.PEM))
    return out_prefix.with_suffix(".pem"), out_prefix.with_suffix(".key")


def apply_stack_client_env(home: Path, environ: dict[str, str] | None = None) -> bool:
    """Make this process a client of the local stack under `home`: its CA and operator key, unless the
    environment already names a key or CA (explicit settings win). Returns whether anything was set."""
    env = os.environ if environ is None else environ
    creds = DevCredentials(home / "secrets")
    if not creds.operator_token.exists():
        return False
    changed = False
    if not (env.get("APPRENTICE_AUTH_TOKEN") or env.get("APPRENTICE_AUTH_TOKEN_FILE")):
        env["APPRENTICE_AUTH_TOKEN_FILE"] = str(creds.operator_token)
        changed = True
    if not env.get("APPRENTICE_TLS_CA") and creds.ca.exists():
        env["APPRENTICE_TLS_CA"] = str(creds.ca)
        changed = True
    return changed


def ensure_dev_credentials(home: Path, tenants: tuple[str, ...] = ("demo", "default")) -> DevCredentials:
    """Create the stack's credentials under `<home>/secrets/` if missing; add backend keys for new tenants."""
    creds = DevCredentials(home / "secrets")
    d = creds.directory
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    if not (creds.ca.exists() and (d / "ca.key").exists()):
        make_ca(d)
        issue_cert(creds.ca, d / "ca.key", d / "server", "localhost", server=True)
    elif not creds.server_cert.exists():
        issue_cert(creds.ca, d / "ca.key", d / "server", "localhost", server=True)
    if not creds.interaction_id_secret.exists():
        _write(creds.interaction_id_secret, secrets.token_urlsafe(32).encode())
    lines = creds.keys_file.read_text().splitlines() if creds.keys_file.exists() else []
    wanted = [("operator", OPERATOR_ID, "", creds.operator_token), ("service", SERVICE_ID, "", creds.service_token),
              ("metrics", METRICS_ID, "", creds.metrics_token)]
    wanted += [("backend", f"{t}-backend", t, creds.backend_token(t)) for t in tenants]
    changed = False
    for role, key_id, tenant, token_path in wanted:
        if not token_path.exists():
            token_path.parent.mkdir(parents=True, exist_ok=True)
            _write(token_path, secrets.token_urlsafe(32).encode())
            if token_path == creds.metrics_token:       # the scraper may run as another user (its property's why)
                os.chmod(token_path.parent, 0o755)
                os.chmod(token_path, 0o644)
        head = f"{role}:{key_id}{'@' + tenant if tenant else ''}="
        if not any(line.startswith(head) for line in lines):
            lines.append(head + creds.token(token_path))
            changed = True
    if changed or not creds.keys_file.exists():
        _write(creds.keys_file, ("\n".join(lines) + "\n").encode())
    return creds


def main(argv: list[str] | None = None) -> int:
    """`apprentice secrets init [--home DIR] [--tenants a,b]`: create (or extend) a stack's development
    credentials; prints where they are. Used by the compose file's init container and by hand."""

    ap = argparse.ArgumentParser(prog="apprentice secrets", description=main.__doc__)
    ap.add_argument("action", choices=["init"])
    ap.add_argument("--home", type=Path, default=None, help="stack home (default: APPRENTICE_HOME or ./.apprentice)")
    ap.add_argument("--tenants", default="demo,default", help="comma-separated tenants to give backend keys")
    ns = ap.parse_args(argv)
    creds = ensure_dev_credentials(ns.home or default_home(), tuple(t for t in ns.tenants.split(",") if t))
    print(f"development credentials in {creds.directory}: CA ca.pem, keys keys.txt, tokens *.token")
    return 0
