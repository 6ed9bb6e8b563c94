"""Grader service settings, from `APPRENTICE_GRADER_*` environment variables (no torch, no faust import).

The grader *rules* (which graders per tenant and task) live in a YAML file (`config_path`, schema in
`shared/grading/schema.py`); these settings are about running the stream processor.

The native runtime is gone (faust is the only one), and with it `APPRENTICE_GRADER_RUNTIME` and the native-only
settings. A variable of them left in an environment is handled at start by `_gone_settings`:

- `APPRENTICE_GRADER_RUNTIME=faust`: a warning, then the grader starts. It names what runs anyway, and
  manifests that spelled the old default out keep working.
- `APPRENTICE_GRADER_RUNTIME=native` (or anything else): a startup error (exit 2, one line). That operator
  asked for another runtime, with its own exactly-once mechanism (Kafka transactions) and its own group
  members; starting faust in its place, perhaps beside native workers of an older release still in the
  consumer group, is a decision for them, not a silent default.
- the native-only tuning variables (`TRANSACTION_TIMEOUT_S`, `RESTORE_TIMEOUT_S`, `SHUTDOWN_GRACE_S`): a
  warning each; they tuned something that no longer exists, and nothing that remains changes meaning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.grader.core.limits import STATE_HEADROOM, Limits
from shared.settings import ApprenticeSettings, CommonSettings, SettingMoved

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).with_name("default_config.yaml")

ENV_PREFIX = "APPRENTICE_GRADER_"

NATIVE_ONLY = ("transaction_timeout_s", "restore_timeout_s", "shutdown_grace_s")
"""Settings of the removed native runtime: warned about when set, never read."""


class SettingRemoved(SettingMoved):
    """A removed setting whose value asks for something that no longer exists (shared/startup.py prints it
    as one line and exits 2, as for a moved one)."""


def _env(name: str, environ: Mapping[str, str]) -> str:
    """`name` in `environ` without regard to case, as pydantic-settings reads variables ("" = unset)."""
    return next((v for k, v in environ.items() if k.upper() == name.upper()), "")


def _gone_settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """The runtime choice and the native-only settings, as keywords or variables: see the module docstring."""
    runtime = str(values.get("runtime") or _env(ENV_PREFIX + "RUNTIME", environ)).strip()
    if runtime.lower() not in ("", "faust"):
        raise SettingRemoved(f"{ENV_PREFIX}RUNTIME={runtime} asks for a runtime that was removed: faust is the "
                             f"grader's only runtime (services/grader/README.md); stop every {runtime} worker, "
                             f"then unset {ENV_PREFIX}RUNTIME")
    if runtime:
        log.warning("%sRUNTIME is no longer read: faust is the grader's only runtime; unset it", ENV_PREFIX)
    for name in NATIVE_ONLY:
        if name in values or _env(ENV_PREFIX + name, environ):
            log.warning("%s%s is no longer read (a setting of the removed native runtime); unset it",
                        ENV_PREFIX, name.upper())


class GraderSettings(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    def __init__(self, **values: Any) -> None:
        _gone_settings(values, os.environ)
        super().__init__(**{k: v for k, v in values.items() if k != "runtime" and k not in NATIVE_ONLY})

    common: CommonSettings = Field(default_factory=CommonSettings)

    config_path: Path = DEFAULT_CONFIG
    """Grader-config YAML (tenants, tasks, graders, detector thresholds). Validated at start."""

    app_name: str = "apprentice-grader"
    """Faust app id (= consumer group) after the topic prefix; changelog and internal topics derive from it."""

    partitions: int | None = Field(default=None, ge=1)
    """Partitions of the internal join topic and of the table: bounds how many workers share the work.
    None = the deployment's stream partitions (APPRENTICE_STREAM_PARTITIONS, docs/capacity.md). Fixed for
    the life of the app: its table's changelog is partitioned by it."""

    @property
    def join_partitions(self) -> int:
        return self.partitions if self.partitions is not None else self.common.stream_partitions

    store: Literal["memory://"] = "memory://"
    """Faust table store. memory:// restores the table from its changelog at start (seconds for ~10^5
    pending interactions). The grade stage writes the changelog itself with explicit partitions (see
    stream/grade.py), which a disk store keyed by the current event's partition would not follow."""

    batch_max: int = Field(default=500, ge=1)
    """Records per processing batch (each stage's `take_events`). Each grade batch costs three acknowledged
    writes (states, graded records, confirmation: stream/grade.py), so larger batches mean higher
    throughput and slightly higher latency."""

    batch_within_s: float = Field(default=0.05, gt=0)
    """A batch is processed after this long even when not full (latency bound under light load)."""

    commit_interval_s: float = Field(default=1.0, gt=0)
    """How often consumed offsets are committed (records already processed; a shorter
    interval replays fewer after a crash)."""

    stall_after_s: float = Field(default=30.0, gt=0)
    """A source or join partition whose committed offset has stayed short of its end for
    this long is resumed and re-read from that offset (services/grader/core/stall.py)."""

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
    """Inference service host:port for the LLM judge (docs/architecture.md §2)."""

    judge_backend: str = "inference"
    """Where the LLM judge runs (`inference` = the Apprentice Inference service's Generate)."""

    judge_tenant: str = "grader"
    """Tenant the judge's Generate calls use: a tenant with no versions of its own, so the judge is the
    base (or operator) model rather than a policy being trained on these very rewards."""

    replication: int = Field(default=0, ge=0)
    """Replication factor of the grader's internal and changelog topics; 0 = from the cluster's size (3, with
    min.insync.replicas=2, from three brokers on; else 1: shared/kafka/durability.py)."""

    session_timeout_s: float = Field(default=10.0, ge=3.0)
    """Kafka consumer session timeout. After a crash, the group waits this long for the dead member
    before handing its partitions to a restarted or surviving worker (faust's default is 60 s)."""

    max_poll_interval_s: float = Field(default=300.0, ge=6.0, le=3600.0)
    """Kafka consumer `max.poll.interval.ms`: a member that does not poll for this long is thrown out of its
    group. Slow judge calls do not count against it: faust fetches in the background. At least the
    session timeout (Kafka refuses less)."""

    instance_id: str = ""
    """Static group membership (`group.instance.id`): a worker restarted under the same id takes its
    partitions back at once. Must differ between replicas. "" = dynamic membership."""

    # --- bounds on what one interaction may accumulate (services/grader/core/limits.py) -----------------
    max_feedback: int = Field(default=32, ge=1)
    """Feedback events joined to one interaction; later ones are dead-lettered (the interaction is still
    graded). Real traffic sends a handful (thumbs, a rating, a correction, a few KPIs)."""

    max_feedback_bytes: int = Field(default=128 * 1024, ge=1024)
    """Total bytes of the feedback joined to one interaction (and the most one event may have); past it
    feedback is dead-lettered. Fits several corrections of the API's longest comment (20,000 characters)
    while keeping the state and the graded record far below a Kafka record."""

    max_comment_chars: int = Field(default=20_000, ge=1)
    """Longest feedback comment (characters); longer feedback is dead-lettered. Equal to the Feedback
    API's own limit, so feedback accepted there is never refused here for its length."""

    feedback_skew_s: float = Field(default=300.0, ge=0)
    """Clock skew allowed on feedback occurred_at: feedback dated more than this before its interaction,
    or more than this in the future, is dead-lettered. 5 minutes, as the Feedback API allows."""

    max_record_bytes: int = Field(default=1_000_000, ge=200_000)
    """Largest record the grader writes (state, graded record, join bundle): librdkafka's default
    `message.max.bytes`, below the broker's default limit (1 MiB). Interactions too large to leave room
    for a full feedback budget under it are dead-lettered. Raise it only with the topics' limits."""

    metrics_port: int = 9102
    """Prometheus endpoint (docs/architecture.md §2); 0 disables it."""

    workdir: Path | None = None
    """Faust's data directory; None = `<APPRENTICE_HOME>/grader`."""

    log_level: str = "INFO"
    """Log level of the faust worker (faust's and aiokafka's loggers); the service's own follow APPRENTICE_LOG_LEVEL."""

    fault_injection: str = ""
    """Tests only: `after_state:N` / `after_emit:N` ends the process abruptly (os._exit, like kill -9) in
    the N-th grade batch that emits, right after its phase (a) / (b) (stream/grade.py).
    `fail_after_state:N`: the batch raises at that point instead (a Kafka time-out under load), and the
    worker must recover it by itself."""

    @field_validator("fault_injection")
    @classmethod
    def _fault(cls, v: str) -> str:
        point, _, count = v.partition(":")
        if v and (point not in ("after_state", "after_emit", "fail_after_state") or not count.isdigit()):
            raise ValueError("fault_injection must be '', 'after_state:N', 'after_emit:N' or 'fail_after_state:N'")
        return v

    @model_validator(mode="after")
    def _poll_after_session(self) -> GraderSettings:
        if self.max_poll_interval_s < self.session_timeout_s:
            raise ValueError(f"APPRENTICE_GRADER_MAX_POLL_INTERVAL_S={self.max_poll_interval_s:g} is below "
                             f"APPRENTICE_GRADER_SESSION_TIMEOUT_S={self.session_timeout_s:g}; Kafka needs the poll "
                             "interval to be at least the session timeout")
        return self

    @model_validator(mode="after")
    def _room_for_state(self) -> GraderSettings:
        room = self.max_record_bytes - self.max_feedback_bytes - STATE_HEADROOM
        if room < 100_000:
            raise ValueError(f"APPRENTICE_GRADER_MAX_RECORD_BYTES={self.max_record_bytes} leaves {room} bytes for an "
                             f"interaction after the feedback budget (APPRENTICE_GRADER_MAX_FEEDBACK_BYTES="
                             f"{self.max_feedback_bytes}) and 64 KiB of state headroom; raise it or lower the budget")
        return self

    def limits(self) -> Limits:
        """The bounds on one interaction (core/limits.py), with the interaction-id MAC key shared with
        inference (b"" = none). Built here, not in the core: the core never reads settings."""
        return Limits(max_feedback=self.max_feedback, max_feedback_bytes=self.max_feedback_bytes,
                      max_comment_chars=self.max_comment_chars, skew_s=self.feedback_skew_s,
                      max_record_bytes=self.max_record_bytes, id_secret=self.common.interaction_id_key())

    @property
    def app_id(self) -> str:
        """Includes the topic prefix so that namespaces (tests, several stacks) never share state."""
        return self.common.topics.group_id(self.app_name)

    @property
    def join_topic(self) -> str:
        """Internal topic: interactions, feedback, judge results and ticks, keyed by interaction id."""
        return f"{self.app_id}-join"

    @property
    def judge_topic(self) -> str:
        """Internal topic: interactions waiting for the LLM judge, keyed by group id."""
        return f"{self.app_id}-judge"

    @property
    def pending_changelog(self) -> str:
        """The pending table's changelog (faust's name for table `pending`): interaction id -> state."""
        return f"{self.app_id}-pending-changelog"

    @property
    def judge_changelog(self) -> str:
        """The judge-groups table's changelog (faust's name for table `judge-groups`): group id -> group."""
        return f"{self.app_id}-judge-groups-changelog"

    @property
    def datadir(self) -> Path:
        return self.workdir or (self.common.home / "grader")
