"""Settings --> gRPC TLS credentials for servers (TLS or mutual TLS) and for the channels that dial them."""

from __future__ import annotations

from pathlib import Path

import grpc

from shared.settings import CommonSettings


class TLSConfigError(ValueError):
    """TLS settings that cannot work together; the message names the variables to set."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TLSConfigError(f"cannot read {what} {path}: {e}") from e


def server_credentials(common: CommonSettings) -> grpc.ServerCredentials | None:
    """TLS server credentials, or None for a plaintext server (no certificate configured)."""
    if common.tls_cert is None and common.tls_key is None:
        if common.tls_client_auth:
            raise TLSConfigError("APPRENTICE_TLS_CLIENT_AUTH needs APPRENTICE_TLS_CERT and APPRENTICE_TLS_KEY")
        return None
    if common.tls_cert is None or common.tls_key is None:
        raise TLSConfigError("set both APPRENTICE_TLS_CERT and APPRENTICE_TLS_KEY (server certificate and key)")
    pair = [(_read(common.tls_key, "TLS key"), _read(common.tls_cert, "TLS certificate"))]
    if common.tls_client_auth:
        if common.tls_ca is None:
            raise TLSConfigError("APPRENTICE_TLS_CLIENT_AUTH needs APPRENTICE_TLS_CA to verify client certificates")
        return grpc.ssl_server_credentials(pair, root_certificates=_read(common.tls_ca, "TLS CA"),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials(pair)


def channel_credentials(common: CommonSettings) -> grpc.ChannelCredentials | None:
    """TLS channel credentials (verify the server against `tls_ca`, present a client certificate when one
    is configured), or None when no CA is configured (plaintext)."""
    if common.tls_ca is None:
        return None
    key = chain = None
    if common.tls_client_cert is not None or common.tls_client_key is not None:
        if common.tls_client_cert is None or common.tls_client_key is None:
            raise TLSConfigError("set both APPRENTICE_TLS_CLIENT_CERT and APPRENTICE_TLS_CLIENT_KEY")
        key = _read(common.tls_client_key, "TLS client key")
        chain = _read(common.tls_client_cert, "TLS client certificate")
    return grpc.ssl_channel_credentials(root_certificates=_read(common.tls_ca, "TLS CA"), private_key=key,
                                        certificate_chain=chain)
