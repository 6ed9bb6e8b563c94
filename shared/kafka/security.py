"""Kafka client security settings (`APPRENTICE_KAFKA_SECURITY_PROTOCOL`, `..._SASL_*`, `..._SSL_*`) -->
the configuration of each Kafka client library Apprentice uses.

Every Kafka client in the code base takes its security from here, so one set of environment variables
secures all of them:

- `librdkafka_config(...)` -> dict merged into confluent-kafka `Producer` / `Consumer` / `AdminClient`
  configs (`security.protocol`, `sasl.*`, `ssl.*`);
- `faust_credentials(...)` -> faust's `broker_credentials` (faust passes them to aiokafka).

Each takes the settings explicitly (`CommonSettings`, or an already resolved `KafkaSecurity`); with none
it reads `CommonSettings()` from the environment (~0.4 ms, no caching: a changed environment or a rotated
password file is seen by the next client). PLAINTEXT, the default, yields `{"security.protocol":
"plaintext"}` only, i.e. exactly librdkafka's and aiokafka's own defaults.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.settings import CommonSettings

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
SSL_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})


@dataclass(frozen=True)
class KafkaSecurity:
    """How a client authenticates to the brokers and protects the connection (already validated)."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_ca: Path | None = None
    ssl_cert: Path | None = None
    ssl_key: Path | None = None

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> KafkaSecurity:
        pw = settings.kafka_sasl_password
        return cls(protocol=settings.kafka_security_protocol, mechanism=settings.kafka_sasl_mechanism,
                   username=settings.kafka_sasl_username, password=pw.get_secret_value() if pw else None,
                   ssl_ca=settings.kafka_ssl_ca, ssl_cert=settings.kafka_ssl_cert, ssl_key=settings.kafka_ssl_key)

    @property
    def sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS

    @property
    def tls(self) -> bool:
        return self.protocol in SSL_PROTOCOLS

    def librdkafka(self) -> dict[str, Any]:
        """confluent-kafka (librdkafka) configuration keys."""
        config: dict[str, Any] = {"security.protocol": self.protocol.lower()}
        if self.sasl:
            config["sasl.mechanism"] = self.mechanism
            config["sasl.username"] = self.username
            config["sasl.password"] = self.password
        if self.tls:
            # Certificates are verified against this CA (or the system's CAs when unset), host names too
            # (librdkafka's default `ssl.endpoint.identification.algorithm=https`).
            if self.ssl_ca is not None:
                config["ssl.ca.location"] = str(self.ssl_ca)
            if self.ssl_cert is not None and self.ssl_key is not None:
                config["ssl.certificate.location"] = str(self.ssl_cert)
                config["ssl.key.location"] = str(self.ssl_key)
        return config

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for Python clients (None unless the protocol uses TLS): verifies the brokers'
        certificates and host names against `ssl_ca` (or the system's CAs), presents the client
        certificate for mutual TLS when one is configured."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=str(self.ssl_ca) if self.ssl_ca else None)
        if self.ssl_cert is not None and self.ssl_key is not None:
            ctx.load_cert_chain(str(self.ssl_cert), str(self.ssl_key))
        return ctx

    def faust(self) -> CredentialsT | None:
        """faust's `broker_credentials` (None for PLAINTEXT: faust's default, no authentication)."""
        # heavy: faust, for the grader only (the other services never load it)
        import faust

        if self.sasl:
            return faust.SASLCredentials(username=self.username, password=self.password,
                                         ssl_context=self.ssl_context(), mechanism=self.mechanism)
        if self.tls:
            return faust.SSLCredentials(self.ssl_context())
        return None


PLAINTEXT = KafkaSecurity()
"""No TLS, no authentication: the local broker's own plain listener (set-up, health probes)."""

SecuritySource = KafkaSecurity | CommonSettings | None
"""What the Kafka helpers accept: resolved security, the settings to take it from, or None = the
environment (`CommonSettings()`)."""


def resolve(source: SecuritySource = None) -> KafkaSecurity:
    """The client security for `source` (see `SecuritySource`)."""
    if isinstance(source, KafkaSecurity):
        return source
    return KafkaSecurity.from_settings(source if source is not None else CommonSettings())


def librdkafka_config(source: SecuritySource = None) -> dict[str, Any]:
    """Security keys to merge into a confluent-kafka client config."""
    return resolve(source).librdkafka()


def faust_credentials(source: SecuritySource = None) -> CredentialsT | None:
    """faust's `broker_credentials` for `faust.App(...)`."""
    return resolve(source).faust()
