"""Grader service settings, from `APPRENTICE_GRADER_*` environment variables (no torch, no faust import).

The grader *rules* (which graders per tenant and task) live in a YAML file (`config_path`, schema in
`shared/grading/schema.py`); these settings are about running the stream processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.config import CommonSettings

DEFAULT_CONFIG = Path(__file__).with_name("default_config.yaml")


class GraderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_GRADER_", extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)

    config_path: Path = DEFAULT_CONFIG
    """Grader-config YAML (tenants, tasks, graders, detector thresholds). Validated at start."""

    app_name: str = "apprentice-grader"
    """Faust app id (= consumer group) after the topic prefix; changelog and internal topics derive from it."""

    partitions: int = Field(default=6, ge=1)
    """Partitions of the internal join topic and of the table: bounds how many workers share the work.
    Matches the source topics (DESIGN.md section 3)."""

    store: Literal["memory://"] = "memory://"
    """Faust table store. memory:// restores the table from its changelog at start (seconds for ~10^5
    pending interactions). The grade stage writes the changelog itself with explicit partitions (see
    app.py), which a disk store keyed by the current event's partition would not follow."""

    batch_max: int = Field(default=500, ge=1)
    """Records per processing batch. Each batch costs two flushes (state, then graded records), so
    larger batches mean higher throughput and slightly higher latency."""

    batch_within_s: float = Field(default=0.05, gt=0)
    """A batch is processed after this long even when not full (latency bound under light load)."""

    tick_interval_s: float = Field(default=1.0, gt=0)
    """How often windows and retention are checked. Window expiry is late by at most this much."""

    retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long an interaction stays in the table after its window: late feedback within this time
    still produces a revision; after it, the feedback is logged and dropped (an orphan)."""

    orphan_feedback_s: float = Field(default=24 * 3600.0, gt=0)
    """Feedback whose interaction never arrives is kept this long, then dropped with a log line."""

    verify_margin_s: float = Field(default=5.0, ge=0)
    """Clock margin when recovery looks in the graded topic for records emitted just before a crash."""

    inference_endpoint: str = "127.0.0.1:50051"
    """Inference service host:port for the LLM judge (DESIGN.md section 2)."""

    judge_backend: str = "inference"
    """Where the LLM judge runs (`inference` = the Apprentice Inference service's Generate)."""

    judge_tenant: str = "grader"
    """Tenant the judge's Generate calls use: a tenant with no versions of its own, so the judge is the
    base (or operator) model rather than a policy being trained on these very rewards."""

    replication: int = Field(default=1, ge=1)
    """Replication factor of the internal and changelog topics faust creates (3 in production)."""

    session_timeout_s: float = Field(default=10.0, ge=3.0)
    """Kafka consumer session timeout. After a crash, the group waits this long for the dead member
    before handing its partitions to a restarted or surviving worker (faust's default is 60 s)."""

    instance_id: str = ""
    """Static group membership (`group.instance.id`): a worker restarted under the same id takes its
    partitions back at once. Must differ between replicas; "" = dynamic membership."""

    metrics_port: int = 9102
    """Prometheus endpoint (DESIGN.md section 2); 0 disables it."""

    workdir: Path | None = None
    """Faust's data directory; None = `<APPRENTICE_HOME>/grader`."""

    log_level: str = "INFO"

    fault_injection: str = ""
    """Tests only: `after_state:N` / `after_emit:N` ends the process abruptly (os._exit, like kill -9)
    right after phase (a) / (b) of the N-th batch that emits (app.py), to prove crash recovery."""

    @field_validator("fault_injection")
    @classmethod
    def _fault(cls, v: str) -> str:
        if v and (v.partition(":")[0] not in ("after_state", "after_emit") or not v.partition(":")[2].isdigit()):
            raise ValueError("fault_injection must be '', 'after_state:N' or 'after_emit:N'")
        return v

    @property
    def app_id(self) -> str:
        """Includes the topic prefix so that namespaces (tests, several stacks) never share state."""
        return f"{self.common.topic_prefix}{self.app_name}"

    @property
    def join_topic(self) -> str:
        """Internal topic: interactions, feedback, judge results and ticks, keyed by interaction id."""
        return f"{self.app_id}-join"

    @property
    def judge_topic(self) -> str:
        """Internal topic: interactions waiting for the LLM judge, keyed by group id."""
        return f"{self.app_id}-judge"

    @property
    def datadir(self) -> Path:
        return self.workdir or (self.common.home / "grader")
