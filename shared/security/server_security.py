"""Settings --> everything a gRPC server needs to admit callers: key ring, TLS credentials, bind address."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from shared.security.binding import resolve_bind_host
from shared.security.interceptor import AuthInterceptor
from shared.security.keys import KeyEntry, KeyRing
from shared.security.tls import server_credentials
from shared.settings import CommonSettings


@dataclass
class ServerSecurity:
    keyring: KeyRing
    credentials: grpc.ServerCredentials | None
    insecure: bool

    @classmethod
    def from_settings(cls, common: CommonSettings, *, extra: list[KeyEntry] | None = None) -> ServerSecurity:
        """`extra`: entries a service adds from its own (deprecated) settings, e.g. inference API keys."""
        keyring = KeyRing.from_text(common.auth_keys.get_secret_value(), file=common.auth_keys_file, extra=extra)
        return cls(keyring=keyring, credentials=server_credentials(common), insecure=common.insecure)

    @property
    def authenticated(self) -> bool:
        return self.keyring.enabled

    def bind_host(self, host: str, what: str = "server") -> str:
        return resolve_bind_host(host, authenticated=self.authenticated, insecure=self.insecure, what=what)

    def interceptor(self) -> AuthInterceptor:
        return AuthInterceptor(self.keyring)
