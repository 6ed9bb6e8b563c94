"""Settings common to every service, read from `APPRENTICE_*` environment variables.

Each service composes `CommonSettings` into its own settings class (env prefix
`APPRENTICE_<SERVICE>_`). No torch import here: configs must load fast and validate before any heavy
work starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.topics import Topics


def default_home() -> Path:
    """Where local state lives (broker data, logs, stores): `.apprentice/` in the working directory."""
    return Path(os.environ.get("APPRENTICE_HOME", Path.cwd() / ".apprentice"))


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers. Points everything at an external cluster when set."""

    topic_prefix: str = ""
    """Namespace prepended to every topic name. Empty in production (the contract names); tests use it."""

    model: str = "smollm2-135m-instruct"
    """`smollm2-135m-instruct` (default, offline recipe), `tiny-random` (tests), or a HF id / local path."""

    model_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "apprentice" / "models")
    """Converted models are cached here (the GGUF conversion takes ~16 s, loading the cache ~1 s)."""

    home: Path = Field(default_factory=default_home)
    """Local state: broker data, logs, spools, weight store."""

    log_level: str = "INFO"
    log_json: bool = True
    """Structured JSON logs (one object per line, with trace ids); plain text when false."""

    torch_threads: int = 0
    """Intra-op threads for torch; 0 = torch's default. The demo machine has 2 cores."""

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("APPRENTICE_KAFKA_BOOTSTRAP must name at least one host:port")
        return v

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)
