"""`apprentice env`: the shell lines that make stock clients (OpenAI SDKs, curl, Node fetch, Go) trust and
reach the local stack: `eval "$(apprentice env)"`.

TLS is on by default under `apprentice up`, with the stack's own development CA; a client that was not
told about that CA fails with a bare "Connection error." (Python SDK) or "fetch failed" (Node), which does
not say what is wrong. Each runtime reads a different variable, and some of them *replace* the system's
roots instead of adding to them (Python's `SSL_CERT_FILE`, requests' `REQUESTS_CA_BUNDLE`, curl's
`CURL_CA_BUNDLE`, Go's `SSL_CERT_FILE` on Linux, gRPC C-core's `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`), so those point at `ca-bundle.pem`: the system's CAs plus
the stack's, so public HTTPS (model downloads, package indexes) keeps working in the same shell. Node's
`NODE_EXTRA_CA_CERTS` adds, so it gets the stack's CA alone. Paths are absolute: the lines work from any
folder once evaluated.
"""

from __future__ import annotations

import argparse
import os
import shlex
import ssl
import sys
from pathlib import Path

from shared.contracts.stack_endpoints import read_endpoints, state_home
from shared.contracts.topic_access import ANALYTICS, PRINCIPALS
from shared.settings import CommonSettings, default_home
from tools.broker.local_broker import principal_env
from tools.devca import DevCredentials
from tools.stack.probe import stack_ports

BUNDLE = "ca-bundle.pem"
REPLACING_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
"""Variables whose file replaces the system's roots: they get the bundle (system CAs + the stack's CA).
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH: gRPC C-core clients (grpcio, `apprentice_client` with `tls=True`)."""


def system_ca_file() -> Path | None:
    """The PEM file of the system's trusted CAs this Python's OpenSSL uses (else certifi's, else None).
    Read from the defaults, never from SSL_CERT_FILE itself: that may already name our bundle."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                      "/etc/ssl/cert.pem"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    try:
        # optional: certifi may be absent; the system's bundle is tried first
        import certifi
    except ImportError:
        return None
    return Path(certifi.where())


def write_trust_bundle(creds: DevCredentials) -> tuple[Path, bool]:
    """`<secrets>/ca-bundle.pem` = the system's CAs + the stack's CA, rewritten when either changed;
    returns it and whether the system's CAs are in it."""
    system = system_ca_file()
    local = creds.ca.read_text()
    parts = [system.read_text()] if system is not None else []
    text = "".join(p if p.endswith("\n") else p + "\n" for p in [*parts, local])
    path = creds.directory / BUNDLE
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)     # public certificates only
        tmp.replace(path)
    return path, system is not None


def _export(name: str, value: str) -> str:
    return f"export {name}={shlex.quote(value)}"


def env_lines(home: Path, tenant: str = "default") -> list[str]:
    """The lines `apprentice env` prints for the stack under `home` (its recorded endpoints when it runs,
    else the configured ports). FileNotFoundError when the stack has no development credentials."""
    endpoints = read_endpoints(home)
    secrets = Path(endpoints.tls_ca).parent if endpoints is not None and endpoints.tls_ca else home / "secrets"
    creds = DevCredentials(secrets.resolve())
    token = creds.backend_token(tenant)
    for needed in (creds.ca, token):
        if not needed.exists():
            raise FileNotFoundError(needed)
    bundle, with_system = write_trust_bundle(creds)
    ports = stack_ports(state_home(home))
    base_url = f"https://127.0.0.1:{ports.http}/v1"
    lines = [f"# stock clients -> the local stack ({base_url}, tenant {tenant!r}); eval \"$(apprentice env)\"",
             "# Python (httpx/OpenAI SDK, ssl), Go on Linux and curl read SSL_CERT_FILE / REQUESTS_CA_BUNDLE / "
             "CURL_CA_BUNDLE instead of the system's CAs: "
             + ("the bundle holds both" if with_system else "no system CA file found, the bundle holds the stack's "
                "CA only (public HTTPS fails in this shell)")]
    lines += [_export(var, str(bundle)) for var in REPLACING_VARS]
    lines += [_export("NODE_EXTRA_CA_CERTS", str(creds.ca)),
              _export("OPENAI_BASE_URL", base_url),
              f"export OPENAI_API_KEY=\"$(cat {shlex.quote(str(token))})\"",
              "# the repository's examples (examples/README.md): gRPC target, base URL, CA, backend key",
              _export("APPRENTICE_TARGET", f"127.0.0.1:{ports.inference}"),
              _export("APPRENTICE_BASE_URL", base_url),
              _export("APPRENTICE_CA", str(creds.ca)),
              'export APPRENTICE_API_KEY="$OPENAI_API_KEY"']
    return lines


def kafka_lines(home: Path, bootstrap: str, principal: str = ANALYTICS) -> list[str]:
    """The lines that make a Kafka client of the local broker under `home` log in as `principal` (by
    default `analytics`: read-only, for consumers outside the loop); none before the broker generated its
    credentials. The password stays in its file: the lines name the file."""
    sasl_dir = home / "kafka" / "sasl"
    if not (sasl_dir / f"{principal}.password").exists():
        return []
    env = {"APPRENTICE_KAFKA_BOOTSTRAP": bootstrap, **principal_env(sasl_dir, principal)}
    env.pop("APPRENTICE_KAFKA_SASL_PASSWORD")
    return [f"# Kafka clients as {principal!r} (SECURITY.md §5: what it may read and write); librdkafka: "
            f"security.protocol=SASL_PLAINTEXT sasl.mechanism={env['APPRENTICE_KAFKA_SASL_MECHANISM']} "
            f"sasl.username={principal} sasl.password=<the file's content>",
            *(_export(k, v) for k, v in env.items())]


def main(argv: list[str] | None = None) -> int:
    """`apprentice env [--tenant T]`: print the shell lines that make stock clients trust and call the local
    stack; `eval "$(apprentice env)"` applies them."""

    ap = argparse.ArgumentParser(prog="apprentice env", description=main.__doc__)
    ap.add_argument("--tenant", default="default", help="whose backend key OPENAI_API_KEY is (default: default)")
    ap.add_argument("--kafka", metavar="PRINCIPAL", choices=PRINCIPALS,
                    help="print instead the Kafka client lines of that principal of the local broker "
                         "(analytics: read-only consumers outside the loop)")
    ns = ap.parse_args(argv)
    home = default_home()
    if ns.kafka:
        lines = kafka_lines(home, CommonSettings().kafka_bootstrap, ns.kafka)
        if not lines:
            print(f"apprentice env: the local broker of {home} has no credentials yet: `apprentice kafka start`",
                  file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0
    try:
        lines = env_lines(home, ns.tenant)
    except FileNotFoundError as e:
        print(f"apprentice env: no development credentials for this stack ({e.args[0]} missing): start it with "
              "`apprentice up` (or `apprentice secrets init --tenants ...` for another tenant's key) in this "
              "folder, or set APPRENTICE_HOME", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
