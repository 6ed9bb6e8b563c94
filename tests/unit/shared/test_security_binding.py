"""Bind rules, TLS settings, the role table and the client's token source: the pieces of shared/security
that need no server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.proto.apprentice.v1 import inference_pb2, knowledge_pb2, weights_pb2
from shared.security import policy
from shared.security.binding import InsecureBind, is_loopback, resolve_bind_host
from shared.security.channels import TokenSource, auth_metadata
from shared.security.identity import ANONYMOUS, Identity, Role, acting_as, current_identity
from shared.security.tls import TLSConfigError, channel_credentials, server_credentials
from shared.settings import CommonSettings


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    assert resolve_bind_host(host, authenticated=False, insecure=False) == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.0.2.2", "example.com", "localhost.evil"])
def test_no_keys_no_exposure(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(InsecureBind, match="APPRENTICE_INSECURE=true"):
        resolve_bind_host(host, authenticated=False, insecure=False, what="weights")
    assert resolve_bind_host(host, authenticated=False, insecure=True) == host
    assert resolve_bind_host(host, authenticated=True, insecure=False) == host


def test_the_default_host_follows_authentication() -> None:
    assert resolve_bind_host("", authenticated=False, insecure=False) == "127.0.0.1"
    assert resolve_bind_host("", authenticated=False, insecure=True) == "127.0.0.1"
    assert resolve_bind_host("", authenticated=True, insecure=False) == "0.0.0.0"


def test_every_rpc_has_a_role_rule() -> None:
    """Deny by default: a new RPC without a rule is refused to every key, so each must be listed."""
    declared = {f"/{s.full_name}/{m.name}" for mod in (inference_pb2, knowledge_pb2, weights_pb2)
                for s in mod.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert declared == set(policy.METHOD_ROLES)
    assert policy.allowed_roles("/apprentice.v1.Weights/NoSuchMethod") == frozenset()
    assert policy.is_public("/grpc.health.v1.Health/Check") and not policy.is_public("/apprentice.v1.Weights/List")
    for method, roles in policy.METHOD_ROLES.items():
        assert Role.ANONYMOUS not in roles, method
        if method.startswith("/apprentice.v1.Weights/"):
            assert Role.BACKEND not in roles, method


def test_identity_tenancy() -> None:
    shop = Identity("shop", Role.BACKEND, "acme")
    assert ANONYMOUS.is_anonymous and not shop.is_anonymous
    assert shop.to_principal().tenant == "acme" and shop.to_principal().role == "backend"
    assert current_identity() is None
    with acting_as(shop):
        assert current_identity() == shop
    assert current_identity() is None


def _common(**kw: object) -> CommonSettings:
    base: dict[str, object] = dict(tls_cert=None, tls_key=None, tls_ca=None, tls_client_auth=False,
                                   tls_client_cert=None, tls_client_key=None)
    base.update(kw)
    return CommonSettings(**base)  # type: ignore[arg-type]


def test_tls_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("not a certificate")
    assert server_credentials(_common()) is None and channel_credentials(_common()) is None
    with pytest.raises(TLSConfigError, match="APPRENTICE_TLS_CERT and APPRENTICE_TLS_KEY"):
        server_credentials(_common(tls_cert=pem))
    with pytest.raises(TLSConfigError, match="needs APPRENTICE_TLS_CERT"):
        server_credentials(_common(tls_client_auth=True))
    with pytest.raises(TLSConfigError, match="needs APPRENTICE_TLS_CA"):
        server_credentials(_common(tls_cert=pem, tls_key=pem, tls_client_auth=True))
    with pytest.raises(TLSConfigError, match="cannot read TLS key"):
        server_credentials(_common(tls_cert=pem, tls_key=tmp_path / "absent.key"))
    with pytest.raises(TLSConfigError, match="APPRENTICE_TLS_CLIENT_CERT and APPRENTICE_TLS_CLIENT_KEY"):
        channel_credentials(_common(tls_ca=pem, tls_client_cert=pem))


def test_token_source_follows_a_rotated_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.security import channels

    f = tmp_path / "token"
    f.write_text("first-token\n")
    clock = [1000.0]
    monkeypatch.setattr(channels.time, "monotonic", lambda: clock[0])
    src = TokenSource("", f)
    assert src() == "first-token"
    f.write_text("second-token-longer\n")
    os.utime(f, ns=(f.stat().st_mtime_ns + 10**9,) * 2)
    assert src() == "first-token"          # checked less than a second ago
    clock[0] += 1.5
    assert src() == "second-token-longer"
    f.unlink()
    clock[0] += 1.5
    assert src() == "second-token-longer"  # a file being replaced: keep the last key
    assert TokenSource(" env-token ", f)() == "env-token"


def test_auth_metadata() -> None:
    from pydantic import SecretStr

    assert auth_metadata(_common(auth_token=SecretStr("k" * 20), auth_token_file=None)) == \
        [("authorization", "Bearer " + "k" * 20)]
    assert auth_metadata(_common(auth_token=SecretStr(""), auth_token_file=None)) == []
