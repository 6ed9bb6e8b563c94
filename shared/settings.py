"""Settings common to every service, read from `APPRENTICE_*` environment variables.

Each service composes `CommonSettings` into its own settings class (env prefix
`APPRENTICE_<SERVICE>_`). No torch import here: configs must load fast and validate before any heavy
work starts.

Related settings are nested groups (`Group`), read from `<PREFIX><GROUP>__<FIELD>` variables; where there is
a choice of kind, a discriminated union on `kind` (`kind_discriminator`): `APPRENTICE_EXTRACTOR_LLM__KIND=openai`
with `APPRENTICE_EXTRACTOR_LLM__MODEL=...`. docs/settings.md lists every variable (tools/settings_reference.py
writes it from the classes' attribute docstrings).

The same thing has the same name in every service: the own gRPC address is `port`/`host`, another
service's address is `<service>_endpoint`. A setting that moved into a group is refused under its old name
(`moved_settings`: the start fails naming the new variable, never a silently ignored one); a setting that is
only renamed keeps its old name for one release through `renamed(...)` (settings classes) or
`renamed_env(...)` (a variable a CLI reads itself).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.contracts.topics import DEFAULT_STREAM_PARTITIONS, Topics
from shared.privacy.business import KINDS, BusinessData, parse_business_data, parse_business_names

log = logging.getLogger(__name__)


def _deprecated(old: str, new: str, *, shadowed: bool = False) -> None:
    """One DeprecationWarning (for tests and `-W error`) and one log line (for operators, who never see
    DeprecationWarnings: Python hides them outside `__main__`)."""
    message = f"{old} is deprecated and will be removed in the next release: use {new}"
    if shadowed:
        message += f" ({new} is set too and wins)"
    warnings.warn(message, DeprecationWarning, stacklevel=4)
    log.warning(message)


def _env_value(name: str, environ: Mapping[str, str]) -> str | None:
    """`name` in `environ`, matched without regard to case (as pydantic-settings reads variables); None when
    unset or empty (compose's `${VAR:-}`: an empty old name carries nothing over)."""
    upper = name.upper()
    for key, value in environ.items():
        if key.upper() == upper and value != "":
            return value
    return None


def renamed(**old_to_new: str) -> Any:
    """A `model_validator(mode="before")` for a settings class whose fields were renamed: the old name,
    as a constructor keyword or as its environment variable (the class's env prefix + the old name), still
    sets the new field, with a DeprecationWarning and a log warning naming the new one. The new name wins
    when both are given.

        class ExtractorSettings(BaseSettings):
            model_config = SettingsConfigDict(env_prefix="APPRENTICE_EXTRACTOR_", extra="ignore")
            port: int = 50053
            _old_names = renamed(grpc_port="port")
    """
    def accept_old_names(cls: type[BaseSettings], data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        prefix = str(cls.model_config.get("env_prefix") or "")
        for old, new in old_to_new.items():
            if old in data:
                value, was, now = data.pop(old), f"{cls.__name__}({old}=...)", f"{cls.__name__}({new}=...)"
            else:
                value, was, now = _env_value(prefix + old, os.environ), (prefix + old).upper(), (prefix + new).upper()
                if value is None:
                    continue
            _deprecated(was, now, shadowed=new in data)
            data.setdefault(new, value)
        return data

    return model_validator(mode="before")(accept_old_names)


def renamed_env(new: str, old: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the variable `new`; else of its deprecated name `old` (with the same warnings as
    `renamed`); else `default`. For variables a command reads itself rather than through settings."""
    env = os.environ if environ is None else environ
    value = _env_value(new, env)
    if value is not None:
        return value
    value = _env_value(old, env)
    if value is None:
        return default
    _deprecated(old, new)
    return value


class SettingMoved(ValueError):
    """An operator set a variable (or a caller a keyword) whose setting moved into a nested group: refused
    at start, naming the new variable, rather than silently ignored (pydantic-settings drops unknown
    variables) or silently misread (an old flat `APPRENTICE_EXTRACTOR_LLM=openai` is not JSON for the
    group `llm`). shared/startup.py prints it as one line."""


def env_name(prefix: str, path: str) -> str:
    """The variable of a setting: `APPRENTICE_EXTRACTOR_` + `llm.model` -> APPRENTICE_EXTRACTOR_LLM__MODEL
    (nested groups are joined by `__`, pydantic-settings' `env_nested_delimiter`)."""
    return (prefix + path.replace(".", "__")).upper()


def refuse_moved(cls: type[BaseSettings], moved: Mapping[str, str], values: Mapping[str, Any],
                 environ: Mapping[str, str] | None = None) -> None:
    """SettingMoved when an old name of `moved` (old field name -> new dotted path) is given, as a keyword
    or as its variable (empty counts as unset: compose's `${VAR:-}`). Every old name found is listed. An
    old name that is now the group itself (`llm` -> `llm.kind`) is refused only as a flat value: a keyword
    or a JSON object for the group is the new form."""
    env = os.environ if environ is None else environ
    prefix = str(cls.model_config.get("env_prefix") or "")
    found = []
    for old, new in moved.items():
        is_group = old in cls.model_fields
        value = _env_value(prefix + old, env)
        if old in values and not is_group:
            found.append(f"{cls.__name__}({old}=...) is now {new}")
        elif value is not None and not (is_group and value.lstrip().startswith("{")):
            found.append(f"{(prefix + old).upper()} was renamed: set {env_name(prefix, new)}")
    if found:
        raise SettingMoved("; ".join(found) + " (the old name is no longer read; docs/settings.md lists every "
                           "variable)")


class ApprenticeSettings(BaseSettings):
    """Base of every settings class: nested groups read from `<PREFIX><GROUP>__<FIELD>` variables, the
    attribute docstrings kept as field descriptions (tools/settings_reference.py prints them into
    docs/settings.md), and `moved_settings` (old flat name -> new dotted path) refused at start."""

    model_config = SettingsConfigDict(extra="ignore", env_nested_delimiter="__", use_attribute_docstrings=True)

    moved_settings: ClassVar[Mapping[str, str]] = {}

    def __init__(self, **values: Any) -> None:
        refuse_moved(type(self), self.moved_settings, values)   # before the sources: an old group name is no JSON
        super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        """`model_validate({...})` does not pass through __init__: its old keys are refused here."""
        if isinstance(data, dict):
            refuse_moved(cls, cls.moved_settings, data, environ={})
        return data


def kind_discriminator(default: str) -> Discriminator:
    """The discriminator of a choice of kind (a union of groups tagged by their `kind`): `default` when the
    environment sets only other fields of the group (`APPRENTICE_EXTRACTOR_LLM__ENDPOINT` alone)."""
    def kind(value: Any) -> str:
        raw = value.get("kind", default) if isinstance(value, dict) else getattr(value, "kind", default)
        return str(raw).strip().lower()

    return Discriminator(kind)


class Group(BaseModel):
    """A nested group of settings: an unknown variable inside the group (a typo, or a field of another
    kind of a choice) fails validation rather than being ignored."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def default_home() -> Path:
    """Where local state lives (broker data, logs, stores): `.apprentice/` in the working directory."""
    return Path(os.environ.get("APPRENTICE_HOME", Path.cwd() / ".apprentice"))


def _json_setting(v: object, name: str, shape: str) -> object:
    """A JSON setting given as text (the environment) --> its value; blank (compose's `${VAR:-}`) is {}."""
    if not isinstance(v, str):
        return v
    if not v.strip():
        return {}
    try:
        return json.loads(v)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not JSON ({e.msg} at character {e.pos}): write {shape}") from None


class CommonSettings(ApprenticeSettings):
    # hide_input_in_errors: a validation error would otherwise echo every input, secrets included.
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_", hide_input_in_errors=True)

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers. Points everything at an external cluster when set."""

    # --- Kafka client security (every producer, consumer and admin client, faust included) ---------
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How clients talk to the brokers. PLAINTEXT (default): no TLS, no authentication (the local broker
    refuses such clients; the CLI and `apprentice up` fill in its generated credentials).
    SASL_PLAINTEXT: SASL authentication, as the local broker's only listener requires.
    SSL / SASL_SSL: TLS to the brokers, verified against `kafka_ssl_ca` (or the system's CAs)."""

    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    """SASL mechanism when the protocol is SASL_*. SCRAM never sends the password itself; PLAIN does, so
    use it only with SASL_SSL, or on loopback for the local broker's `admin` (its JAAS-declared super user)."""

    kafka_sasl_username: str | None = None
    """SASL user name; required by SASL_PLAINTEXT and SASL_SSL."""

    kafka_sasl_password: SecretStr | None = None
    """SASL password (from the environment, never from a file in the repository). When set it wins over
    `kafka_sasl_password_file`."""

    kafka_sasl_password_file: Path | None = None
    """File holding the SASL password (a mounted secret; one trailing newline is ignored). Read at
    start-up when `kafka_sasl_password` is not set. The local broker writes one per principal under
    `<home>/kafka/sasl/`."""

    kafka_ssl_ca: Path | None = None
    """PEM CA bundle that signs the brokers' certificates (SSL, SASL_SSL); unset = the system's CAs."""

    kafka_ssl_cert: Path | None = None
    """PEM client certificate for mutual TLS (SSL, SASL_SSL); set together with `kafka_ssl_key`."""

    kafka_ssl_key: Path | None = None
    """PEM private key of `kafka_ssl_cert` (unencrypted; mount it as a secret)."""

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _kafka_upper(cls, v: object) -> object:
        return v.strip().upper() if isinstance(v, str) else v

    @field_validator("kafka_sasl_username", "kafka_sasl_password", "kafka_sasl_password_file", "kafka_ssl_ca",
                     "kafka_ssl_cert", "kafka_ssl_key", "auth_keys_file", "auth_token_file", "tls_cert", "tls_key",
                     "tls_ca", "tls_client_cert", "tls_client_key", "interaction_id_secret_file", "record_keys_dir",
                     mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v  # compose's `${VAR:-}` yields ""

    @model_validator(mode="after")
    def _kafka_security_consistent(self) -> CommonSettings:
        """Fail at start, naming the variable to change, rather than connect without the intended
        protection (credentials set but unused) or fail later at the first Kafka call."""
        protocol = self.kafka_security_protocol
        sasl, tls = protocol.startswith("SASL_"), protocol in ("SSL", "SASL_SSL")
        if self.kafka_sasl_password is None and self.kafka_sasl_password_file is not None:
            f = self.kafka_sasl_password_file
            try:
                secret = f.read_text().removesuffix("\n")
            except OSError as e:
                raise ValueError(f"APPRENTICE_KAFKA_SASL_PASSWORD_FILE={f} cannot be read: {e.strerror}") from e
            if not secret:
                raise ValueError(f"APPRENTICE_KAFKA_SASL_PASSWORD_FILE={f} is empty")
            self.kafka_sasl_password = SecretStr(secret)
        if sasl:
            if not self.kafka_sasl_username:
                raise ValueError(f"APPRENTICE_KAFKA_SECURITY_PROTOCOL={protocol} needs "
                                 "APPRENTICE_KAFKA_SASL_USERNAME")
            if self.kafka_sasl_password is None:
                raise ValueError(f"APPRENTICE_KAFKA_SECURITY_PROTOCOL={protocol} needs a password: set "
                                 "APPRENTICE_KAFKA_SASL_PASSWORD or APPRENTICE_KAFKA_SASL_PASSWORD_FILE")
        elif self.kafka_sasl_username or self.kafka_sasl_password is not None:
            raise ValueError(f"SASL credentials are set but APPRENTICE_KAFKA_SECURITY_PROTOCOL={protocol} does "
                             "not use them: set it to SASL_PLAINTEXT or SASL_SSL, or unset the credentials")
        tls_files = {"APPRENTICE_KAFKA_SSL_CA": self.kafka_ssl_ca, "APPRENTICE_KAFKA_SSL_CERT": self.kafka_ssl_cert,
                     "APPRENTICE_KAFKA_SSL_KEY": self.kafka_ssl_key}
        for name, path in tls_files.items():
            if path is None:
                continue
            if not tls:
                raise ValueError(f"{name} is set but APPRENTICE_KAFKA_SECURITY_PROTOCOL={protocol} does not "
                                 f"use TLS: set it to SSL or SASL_SSL, or unset {name}")
            if not path.is_file():
                raise ValueError(f"{name}={path} is not a readable file")
        if (self.kafka_ssl_cert is None) != (self.kafka_ssl_key is None):
            raise ValueError("mutual TLS needs both APPRENTICE_KAFKA_SSL_CERT and APPRENTICE_KAFKA_SSL_KEY")
        return self
    # --- end of Kafka client security -----------------------------------------------------------------

    # --- record signatures (shared/kafka/signing.py, shared/kafka/trust.py; SECURITY.md) ---------------
    record_keys_dir: Path | None = None
    """Record-signing keys: `<principal>.key` (the principal's Ed25519 private key; a pod mounts its own
    only) and `<principal>@<key_id>.pub` (every principal's public key). Unset: `<home>/secrets/records`,
    where the local broker writes a pair per principal."""

    record_signatures: Literal["required", "off"] = "required"
    """`required`: every record a service writes is signed with its principal's key, and every record it
    reads must carry a valid signature by a principal the topic table lets write that topic (anything else
    is dead-lettered with the reason). `off`: neither, insecure: anyone who can write a topic is trusted."""

    def record_keys_path(self) -> Path:
        """Where the record-signing keys are (`record_keys_dir`, or its default under `home`)."""
        return self.record_keys_dir if self.record_keys_dir is not None else self.home / "secrets" / "records"

    topic_prefix: str = ""
    """Namespace prepended to every topic name, consumer group id and transactional id (shared/contracts/topics.py),
    so several stacks can share one cluster. Empty in production (the contract names); tests use it."""

    stream_partitions: int = Field(default=DEFAULT_STREAM_PARTITIONS, ge=1)
    """Partitions of the interactions, feedback and graded topics when a service or `apprentice topics` creates
    them; also the grader's join partitions unless APPRENTICE_GRADER_PARTITIONS says otherwise. It bounds how
    many grader workers share the traffic: docs/capacity.md sizes it (6 up to ~1,000 requests/s, 24 at 10,000).
    Set before the topics exist: existing topics keep their count, and the grader's join cannot change its
    count under a running table (a new count means a new grader app_name)."""

    model: str = "smollm2-135m-instruct"
    """`smollm2-135m-instruct` (default, offline recipe), `tiny-random` (tests), or a HF id / local path."""

    model_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "apprentice" / "models")
    """Converted models are cached here (the GGUF conversion takes ~16 s, loading the cache ~1 s); default
    `~/.cache/apprentice/models`."""

    home: Path = Field(default_factory=default_home)
    """Local state: broker data, logs, spools, weight store; default `.apprentice/` in the working directory."""

    log_level: str = "INFO"
    """Python logging level of the service's own loggers (DEBUG, INFO, WARNING, ERROR)."""

    log_json: bool | None = None
    """Structured JSON logs (one object per line, with trace ids) when true; plain text when false; unset:
    plain text on a terminal, JSON everywhere else (log files, pipes, containers)."""

    torch_threads: int = 0
    """Intra-op threads for torch; 0 = torch's default. The demo machine has 2 cores."""

    # --- gRPC authentication and TLS (shared/security; SECURITY.md) --------------------------------
    auth_keys: SecretStr = SecretStr("")
    """Credentials a server accepts: entries `<role>:<key_id>[@<tenant>]=<secret|sha256:hex|cert:name>`
    separated by commas (format in shared/security/keys.py). Empty with no key file = unauthenticated,
    and then servers bind to loopback only."""

    auth_keys_file: Path | None = None
    """A mounted file of key entries, one per line; re-read when it changes (rotation without restart)."""

    auth_token: SecretStr = SecretStr("")
    """The key this process presents when it calls another service (a service key for services, an
    operator or backend key for the CLI and tools)."""

    auth_token_file: Path | None = None
    """A mounted file holding that key; used when `auth_token` is empty, re-read when it changes."""

    tls_cert: Path | None = None
    """PEM certificate chain a gRPC server presents; with `tls_key`, servers listen with TLS only."""

    tls_key: Path | None = None
    """PEM private key of `tls_cert`."""

    tls_ca: Path | None = None
    """PEM CA bundle: clients verify servers with it (and then dial with TLS); servers verify client
    certificates with it when `tls_client_auth` is on."""

    tls_client_auth: bool = False
    """Mutual TLS: servers require a client certificate signed by `tls_ca`; its name maps to an identity
    through a `cert:<name>` key entry (a bearer key is still accepted on top)."""

    tls_client_cert: Path | None = None
    """PEM certificate a client presents under mutual TLS."""

    tls_client_key: Path | None = None
    """PEM private key of `tls_client_cert`."""

    insecure: bool = False
    """Allow a server without keys to bind a non-loopback address. Only for isolated networks: anyone who
    reaches the port can then promote models and read every tenant's data."""

    interaction_id_secret: SecretStr = SecretStr("")
    """Key of the MAC that binds every interaction id to its tenant (shared/security/interaction_ids.py),
    and of the pseudonyms captured in place of session ids and the OpenAI `user` field
    (shared/security/pseudonyms.py); the same value on inference pods and graders. Empty = unsigned ids,
    ownership unchecked, session pseudonyms under a random per-process key (dev only)."""

    interaction_id_secret_file: Path | None = None
    """A mounted file holding that key, used when `interaction_id_secret` is empty."""

    def interaction_id_key(self) -> bytes:
        """The interaction-id MAC key as bytes (b"" when none is configured)."""
        value = self.interaction_id_secret.get_secret_value().strip()
        if not value and self.interaction_id_secret_file is not None and self.interaction_id_secret_file.exists():
            value = self.interaction_id_secret_file.read_text().strip()
        return value.encode()

    # --- personal-data redaction (shared/pii; every service that redacts reads this) -------------------
    business_names: Annotated[dict[str, list[str]], NoDecode] = Field(default_factory=dict)
    """Per tenant, the names that are part of its business (products, places, staff who speak for it), as
    JSON: `{"acme": ["Trailmate", "Dana Whitfield"]}`. Redaction (inference capture and feedback, the
    extractor's knowledge filter) keeps a detected name that lies entirely inside an occurrence of one of
    the tenant's names (any case, whole words), so facts that name them can be learned. A user who only
    shares a word with one ("Dana Smith") is still redacted, and a declared name never keeps an e-mail, phone,
    card, IBAN, IP or SSN (shared/privacy/business.py, SECURITY.md). Up to 256 names of 2-100 characters per
    tenant, written out literally (no wildcards). The same as `business_data`'s `names` (both are kept). The demo
    and `apprentice up --task` add the task file's names."""

    business_data: Annotated[dict[str, dict[str, list[str]]], NoDecode] = Field(default_factory=dict)
    """Per tenant, its public business data of every kind, as JSON: `{"acme": {"phones": ["+44 800 414 2277"],
    "emails": ["found@trailmate.co.uk"], "urls": ["trailmate.co.uk/returns"], "addresses": ["12 Harbour Road,
    Leith"], "names": ["Trailmate"]}}` (any of the kinds). Redaction keeps exactly these values in that tenant's
    text: a detection lying inside an occurrence of a declared phone (compared on its digits; an international
    number also in its national form), e-mail, web or street address (any case), or a name inside any of them.
    A user's undeclared phone number or e-mail, and everything in another tenant's text, stays redacted
    (shared/privacy/business.py, SECURITY.md). Up to 256 values per kind per tenant, written out literally. The
    demo and `apprentice up --task` add the task file's `business_data:` and the phones, e-mails and web
    addresses in its business text."""

    @field_validator("business_names", mode="before")
    @classmethod
    def _business_names_json(cls, v: object) -> object:
        v = _json_setting(v, "APPRENTICE_BUSINESS_NAMES", '{"tenant": ["Name", ...]}')
        try:
            return {t: list(names) for t, names in parse_business_names(v).items()}  # type: ignore[arg-type]
        except ValueError as e:
            raise ValueError(f"APPRENTICE_BUSINESS_NAMES: {e}") from None

    @field_validator("business_data", mode="before")
    @classmethod
    def _business_data_json(cls, v: object) -> object:
        v = _json_setting(v, "APPRENTICE_BUSINESS_DATA",
                          f'{{"tenant": {{"phones": ["+44 800 414 2277"], ...}}}} (kinds: {", ".join(KINDS)})')
        try:
            return {t: {k: list(vs) for k, vs in d.items()} for t, d in parse_business_data(v).items()}  # type: ignore[arg-type]
        except ValueError as e:
            raise ValueError(f"APPRENTICE_BUSINESS_DATA: {e}") from None

    @model_validator(mode="after")
    def _business_data_per_tenant_fits(self) -> CommonSettings:
        """Both declarations of a tenant together stay within the bounds (a failure at start, not at the
        first capture)."""
        for tenant in self.business_names.keys() & self.business_data.keys():
            try:
                self.business_data_for(tenant)
            except ValueError as e:
                raise ValueError(f"APPRENTICE_BUSINESS_NAMES and APPRENTICE_BUSINESS_DATA, tenant {tenant!r}: {e}"
                                 ) from None
        return self

    def business_data_for(self, tenant: str) -> BusinessData:
        """The tenant's declared public business data (`business_names` and `business_data` together),
        compiled; none for a tenant that declared none. Never another tenant's."""
        return BusinessData.from_declaration({"names": self.business_names.get(tenant, [])},
                                             self.business_data.get(tenant, {}))

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("APPRENTICE_KAFKA_BOOTSTRAP must name at least one host:port")
        return v

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix, self.stream_partitions)
