"""Weights service settings, from `APPRENTICE_WEIGHTS_*` environment variables (no torch import here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from services.weights.manifests import VERSION_RE
from shared.settings import ApprenticeSettings, CommonSettings, Group

Policy = Literal["manual", "auto", "canary"]
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A tenant name (services/weights/names.py NAME_RE; repeated here so the settings import no gRPC)."""


class LocalStoreSettings(Group):
    """Blobs and manifests in a local directory (services/weights/local_blobstore.py). An object store joins
    as another kind of this group, beside its backend in services/weights/blob_backends.py."""

    kind: Literal["local"] = "local"
    """Which blob store: `local` (the only kind so far)."""

    dir: Path | None = None
    """Where blobs and manifests live; None = `<APPRENTICE_HOME>/weights`."""


class GateLimits(Group):
    """How much worse than the version it replaces a candidate may score before the eval gate blocks it
    (services/weights/gate.py; per step)."""

    heldout_max_drop: float = Field(default=0.1, ge=0.0)
    """Largest allowed drop of the held-out mean rule score (scores are in [0, 1])."""

    ood_max_loglik_drop: float = Field(default=0.5, ge=0.0, json_schema_extra={"unit": "nats/token"})
    """Largest allowed drop of the mean per-token log-likelihood of OOD reference answers, in nats/token.
    Corrupted weights drop it by several nats; an RL step moves it by hundredths."""

    ood_max_rule_drop: float = Field(default=0.1, ge=0.0)
    """Largest allowed drop of the rule score on OOD questions that carry a check (general knowledge)."""

    ood_max_repetition_rise: float = Field(default=0.25, ge=0.0)
    """Largest allowed rise of the OOD greedy repetition rate (share of repeated 3-grams, in [0, 1])."""

    max_hacking_fraction: float = Field(default=0.2, ge=0.0)
    """Block a checkpoint whose training batch had more than this share of samples flagged for reward
    hacking (`hacking_flag_fraction` in the manifest's train_metrics / training_metadata)."""


class DriftLimits(Group):
    """How much worse than the fixed reference (`reference_version`, per tenant `tenant_reference_versions`)
    a candidate may score: per-step limits alone let drift accumulate over promotions."""

    heldout_max_drop: float = Field(default=0.2, ge=0.0)
    """Largest drop of the held-out rule score against the reference: twice the per-step limit, so two
    full-size regressions in a row (or many small ones) add up to a refusal."""

    ood_max_loglik_drop: float = Field(default=1.0, ge=0.0, json_schema_extra={"unit": "nats/token"})
    """Largest drop of the OOD reference-answer log-likelihood against the reference, in nats/token: twice
    the per-step limit (an RL step moves it by hundredths; corrupted weights by several nats)."""

    ood_max_rule_drop: float = Field(default=0.2, ge=0.0)
    """Largest drop of the OOD rule score against the reference: twice the per-step limit (with the 46
    default OOD questions, nine answers lost since the reference)."""

    ood_max_repetition_rise: float = Field(default=0.1, ge=0.0)
    """Largest rise of the OOD repetition rate against the reference. Deliberately tighter than the per-step
    0.25 (not 2-3x it): the drifts to stop were +0.14 (0.017 -> 0.159) and +0.25 (the demo's 0.017 -> 0.084
    -> 0.271), both inside 0.5; candidates without degenerate repetition in the recorded runs stayed within
    +0.06 of their base (GRPO, reward-hack and velo runs: docs/demo-*/report.json). 0.1 is about five times
    SmolLM2's own rate."""


class WeightsSettings(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_WEIGHTS_")

    common: CommonSettings = Field(default_factory=CommonSettings)

    # --- serving -----------------------------------------------------------------------------------
    host: str = ""
    """Interface the gRPC server binds."""

    port: int = 50052
    """gRPC port (docs/architecture.md §2); 0 picks a free port (tests)."""

    metrics_port: int = 9105
    """Prometheus endpoint; 0 disables it."""

    advertised_endpoint: str = ""
    """Written into `ModelUpdate.weights_endpoint` so pods know where to download; "" = pods use their
    configured default (APPRENTICE_WEIGHTS_ENDPOINT)."""

    chunk_size: int = 4 << 20
    """Default Download chunk in bytes. 4 MiB keeps per-message overhead negligible on loopback (the
    download benchmark measured 1 MiB at roughly the same speed; far smaller chunks cost throughput)."""

    max_chunk_size: int = 16 << 20
    """Largest chunk a client may ask for or send (the gRPC message limit is 64 MiB)."""

    max_upload_bytes: int = 64 << 30
    """Refuse an upload whose declared files add up to more than this (protects the disk):
    RESOURCE_EXHAUSTED. 64 GiB holds a 30B-parameter model in bf16."""

    max_uploads_per_identity: int = 2
    """Uploads one credential (key id) may have in flight at once; more are refused with
    RESOURCE_EXHAUSTED. A trainer uploads one checkpoint at a time; 2 lets a retry overlap a stalled call."""

    max_upload_bytes_per_identity: int = 128 << 30
    """Declared bytes one credential may have in flight at once (two uploads of the largest size)."""

    max_upload_bytes_in_flight: int = 256 << 30
    """Declared bytes in flight on this server, every caller together: the most the temp files of
    unfinished uploads may claim on the store's disk."""

    grace_s: float = 10.0
    """Graceful stop: in-flight calls get this long to finish."""

    # --- store -------------------------------------------------------------------------------------
    store: LocalStoreSettings = Field(default_factory=LocalStoreSettings)
    """Where versions are stored: the blob store's kind and its settings."""

    moved_settings: ClassVar[dict[str, str]] = {
        "store_backend": "store.kind", "store_dir": "store.dir",
        **{name: f"gate.{name}" for name in ("heldout_max_drop", "ood_max_loglik_drop", "ood_max_rule_drop",
                                             "ood_max_repetition_rise", "max_hacking_fraction")},
        **{f"{name}_total": f"drift.{name}" for name in ("heldout_max_drop", "ood_max_loglik_drop",
                                                         "ood_max_rule_drop", "ood_max_repetition_rise")}}

    keep_last: int = 5
    """Retention: the newest N versions per model are kept, plus every promoted, canary, pinned and
    rollback-target version (and the full versions a kept LoRA applies to)."""

    gc_interval_s: float = 300.0
    """How often unreferenced versions and blobs are collected (also after every upload)."""

    # --- eval gate ---------------------------------------------------------------------------------
    policy: Policy = "auto"
    """After a checkpoint passes the gate: `manual` (wait for an operator), `auto` (promote at once), or
    `canary` (canary at `canary_fraction`, promote after `canary_min_requests` healthy requests).
    `auto` by default so the demo loop closes; the gate still blocks regressions."""

    evaluate_checkpoints: bool = True
    """Run the eval gate when a CheckpointPublished arrives (off = candidates wait for Promote)."""

    eval_set: Path | None = None
    """Held-out eval set YAML (prompts + rule graders); None = the packaged default for the demo task."""

    ood_set: Path | None = None
    """Out-of-distribution set YAML (general instructions with reference answers, general questions with
    rule checks); None = packaged default."""

    eval_max_new_tokens: int = 32
    """Greedy tokens per eval prompt: the demo's answers state the fact in the first sentence, and the
    gate's cost grows linearly with it (SmolLM2 on 2 shared CPU cores: ~40 s of CPU per model scored on
    the default sets; the serving version's scores are cached, so a candidate costs one model)."""

    eval_batch_size: int = 32
    """Prompts generated together (batched greedy; measured with 30 prompts: about a quarter less CPU than
    batches of 16). With the general OOD questions a task's sets have about 60 prompts: batches of 32 and
    64 scored the routing task's sets in the same time on 2 cores (10-11 s for SmolLM2)."""

    gate: GateLimits = Field(default_factory=GateLimits)
    """Per-step regression limits of the eval gate (against the version a candidate replaces)."""

    # --- eval gate: drift against a fixed reference (cumulative limits) -----------------------------
    reference_version: str = "base"
    """The version every regression check also compares a candidate with, besides the version it replaces:
    `base` (the model every pod loads locally) unless an operator names a stored version of the candidate's
    model (e.g. after a deliberate big change). Per-step limits alone let drift accumulate: OOD repetition
    went 0.017 -> 0.042 -> 0.159 over two promotions, each step inside its limit. Retention keeps the named
    version; a reference that is not stored fails the gate with FAILED_PRECONDITION (nothing is judged)."""

    tenant_reference_versions: dict[str, str] = Field(default_factory=dict)
    """Per-tenant reference, overriding `reference_version` for the candidates of that tenant, as JSON:
    APPRENTICE_WEIGHTS_TENANT_REFERENCE_VERSIONS='{"acme": "v7"}'. A tenant whose operator accepted a
    version's behaviour measures further drift from there, without moving every other tenant's anchor."""

    drift: DriftLimits = Field(default_factory=DriftLimits)
    """Cumulative regression limits of the eval gate (against the reference version)."""

    # --- eval gate: knowledge items the weights hold (informational) --------------------------------
    knowledge_max_items: int = 40
    """Knowledge items the gate asks about per candidate (newest first), each with up to 3 of its questions
    without the item in context; 0 = no knowledge checks and no follower of the knowledge topic. 40 items
    are at most 120 greedy prompts, about twice the default sets' cost; the results never block."""

    # --- orders and pods ---------------------------------------------------------------------------
    canary_fraction: float = 0.1
    """Share of requests sent to the canary under the `canary` policy."""

    canary_min_requests: int = 20
    """Healthy canary requests (summed over pods, from heartbeats) before the `canary` policy promotes."""

    canary_rollback_min_requests: int = 5
    """Canary requests (summed over the live pods that report the canary, service credentials only)
    before their error rate may roll a canary back: one report of one failed request is not evidence.
    At a 10% canary fraction, 5 canary requests are about 50 requests of traffic."""

    canary_max_error_rate: float = 0.1
    """Roll the canary back when more than this share of its requests failed (errors / requests, summed
    over pods, once `canary_rollback_min_requests` were served). A broken model fails nearly every
    request; 10% leaves room for a client hanging up now and then."""

    order_deadline_s: float = 60.0
    """A pod that does not serve what the last order asked within this long is flagged as lagging."""

    heartbeat_timeout_s: float = 30.0
    """A pod silent for longer than this cannot count as converged."""

    pod_forget_s: float = 600.0
    """Pods silent for longer than this disappear from Status (and stop counting against the pod caps)."""

    replica_id: str = ""
    """This replica's name among the weights replicas over one store (the file its pods' heartbeats are
    shared in, services/weights/pod_share.py); "" = `<host name>-<port>`."""

    pod_share_interval_s: float = Field(default=2.0, gt=0)
    """How often this replica writes the heartbeats it received for the other replicas to read."""

    max_pods_per_identity: int = 256
    """Pods one credential may have registered (by heartbeat) at once; a new pod beyond it is refused
    with RESOURCE_EXHAUSTED until one is forgotten. Raise it when every inference pod shares one service
    key and there are more pods than this."""

    max_pods: int = 1024
    """Pods registered at once on this server, every credential and model together (memory, and the
    size of Status)."""

    consumer_group: str = "weights"
    """Kafka consumer group for the checkpoints topic (prefixed with APPRENTICE_TOPIC_PREFIX)."""

    @model_validator(mode="after")
    def _check(self) -> WeightsSettings:
        if not 0 <= self.port <= 65535:
            raise ValueError("APPRENTICE_WEIGHTS_PORT must be in [0, 65535]")
        if not 0 < self.chunk_size <= self.max_chunk_size <= 32 << 20:
            raise ValueError("need 0 < APPRENTICE_WEIGHTS_CHUNK_SIZE <= MAX_CHUNK_SIZE <= 32 MiB")
        if self.keep_last < 1:
            raise ValueError("APPRENTICE_WEIGHTS_KEEP_LAST must be at least 1")
        if not 0 < self.canary_fraction <= 1:
            raise ValueError("APPRENTICE_WEIGHTS_CANARY_FRACTION must be in (0, 1]")
        if self.canary_min_requests < 1:
            raise ValueError("APPRENTICE_WEIGHTS_CANARY_MIN_REQUESTS must be at least 1")
        if self.canary_rollback_min_requests < 1:
            raise ValueError("APPRENTICE_WEIGHTS_CANARY_ROLLBACK_MIN_REQUESTS must be at least 1")
        if not 0 <= self.canary_max_error_rate < 1:
            raise ValueError("APPRENTICE_WEIGHTS_CANARY_MAX_ERROR_RATE must be in [0, 1)")
        for name in ("max_upload_bytes", "max_uploads_per_identity", "max_upload_bytes_per_identity",
                     "max_upload_bytes_in_flight", "max_pods_per_identity", "max_pods"):
            if getattr(self, name) < 1:
                raise ValueError(f"APPRENTICE_WEIGHTS_{name.upper()} must be at least 1")
        if self.knowledge_max_items < 0:
            raise ValueError("APPRENTICE_WEIGHTS_KNOWLEDGE_MAX_ITEMS must be >= 0")
        for tenant, version in {"": self.reference_version, **self.tenant_reference_versions}.items():
            if tenant and TENANT_RE.fullmatch(tenant) is None:
                raise ValueError(f"APPRENTICE_WEIGHTS_TENANT_REFERENCE_VERSIONS: {tenant[:60]!r} is not a tenant name")
            if VERSION_RE.fullmatch(version) is None:
                raise ValueError(f"reference version {version[:70]!r} (tenant {tenant or '*'}) is not a version name "
                                 f"({VERSION_RE.pattern}; `base` = the base model)")
        if min(self.order_deadline_s, self.heartbeat_timeout_s, self.pod_forget_s) <= 0:
            raise ValueError("deadlines and timeouts must be positive seconds")
        return self

    def reference_for(self, tenant: str) -> str:
        """The version a candidate of `tenant` is held against for cumulative drift."""
        return self.tenant_reference_versions.get(tenant, self.reference_version)

    def reference_versions(self) -> set[str]:
        """Every configured reference that is a stored version (what retention must keep)."""
        return {v for v in (self.reference_version, *self.tenant_reference_versions.values()) if v != "base"}

    @property
    def store_root(self) -> Path:
        return self.store.dir if self.store.dir is not None else self.common.home / "weights"
