"""Dashboard settings, from `APPRENTICE_DASHBOARD_*` environment variables (no torch import here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from shared.settings import ApprenticeSettings, CommonSettings, renamed


class DashboardSettings(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_DASHBOARD_")

    common: CommonSettings = Field(default_factory=CommonSettings)

    host: str = ""
    """Interface the HTTP server binds; "" = every interface with keys configured, loopback without."""

    port: int = 8080
    """HTTP port; 0 picks a free port (tests)."""

    weights_endpoint: str = ""
    """The weights service's gRPC address; "" = the running stack's record (endpoints.json), else 127.0.0.1:50052."""

    extractor_endpoint: str = ""
    """The extractor's (Knowledge) gRPC address; "" = the stack's record, else 127.0.0.1:50053."""

    inference_endpoint: str = ""
    """The inference service's gRPC address (health only); "" = the stack's record, else 127.0.0.1:50051."""

    operator_token_file: Path | None = None
    """File holding the key the dashboard reads with (every tenant's knowledge needs an operator key);
    unset = this process's APPRENTICE_AUTH_TOKEN / APPRENTICE_AUTH_TOKEN_FILE. Actions never use it when
    keys are configured: they carry the signed-in operator's own key, so the services audit that person."""

    metrics_ports: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Prometheus endpoints per service, `service=port` (on 127.0.0.1) or `service=host:port` (compose,
    Kubernetes): `inference=9101,grader=grader:9102,...`; unset ones come from the stack's record, else
    127.0.0.1 and the defaults 9101-9105. Grader and trainer serve no gRPC: their metrics endpoint is
    their health."""

    bucket_s: float = 60.0
    """Width of a time bucket of the reward / success / length curves."""

    max_interactions: int = Field(default=50_000, gt=0)
    """Graded interactions kept in memory (the newest); older ones leave the curves."""

    examples: int = Field(default=20, gt=0)
    """Flagged example interactions kept per tenant for the reward-hacking page."""

    refresh_s: float = Field(default=5.0, gt=0)
    """How often the pages fetch fresh data."""

    probe_timeout_s: float = Field(default=3.0, gt=0)
    """Deadline of each gRPC call and probe the dashboard makes."""

    grace_s: float = 5.0
    """Graceful stop: in-flight requests get this long."""

    _old_names = renamed(weights_target="weights_endpoint", knowledge_target="extractor_endpoint",
                         inference_target="inference_endpoint")

    @field_validator("metrics_ports", mode="before")
    @classmethod
    def _parse_ports(cls, v: object) -> object:
        if isinstance(v, str):
            out: dict[str, str] = {}
            for part in filter(None, (p.strip() for p in v.split(","))):
                name, sep, addr = part.partition("=")
                addr = addr.strip()
                host, _, port = addr.rpartition(":")
                if not sep or not port.isdigit() or (":" in addr and not host):
                    raise ValueError(f"APPRENTICE_DASHBOARD_METRICS_PORTS: `{part}` must be `service=port` or "
                                     "`service=host:port`")
                out[name.strip()] = addr if host else f"127.0.0.1:{port}"
            return out
        return v
