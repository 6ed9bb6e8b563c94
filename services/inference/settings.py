"""Inference service settings, from `APPRENTICE_INFERENCE_*` environment variables (no torch import here).

Validated once at start: every error names the variable to change.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, Tag, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.privacy.policy import PiiPolicy, parse_tenant_policies
from shared.security.identity import Identity, Role
from shared.security.keys import KeyEntry
from shared.settings import ApprenticeSettings, CommonSettings, Group, kind_discriminator

EngineName = Literal["transformers", "vllm"]


class TransformersEngineSettings(Group):
    """The CPU default: Hugging Face transformers with this service's own continuous batching."""

    kind: Literal["transformers"] = "transformers"
    """`transformers` or `vllm`: which engine generates; the group's other fields depend on it."""

    device: str = "cpu"
    """Torch device (`cpu`, `cuda`, `cuda:1`)."""


class VllmEngineSettings(Group):
    """vLLM (GPU; needs the `gpu` extra): its own batching, LoRA adapters as vLLM LoRA requests."""

    kind: Literal["vllm"]
    """`transformers` or `vllm`: which engine generates; the group's other fields depend on it."""

    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    """Share of the GPU's memory vLLM may take (weights, KV cache); ignored on a CPU build."""

    max_loras: int = Field(default=4, ge=1)
    """LoRA adapters resident at once; a version beyond it is refused until one is unloaded."""

    max_lora_rank: int = Field(default=64, ge=1)
    """Highest LoRA rank accepted (vLLM sizes its adapter slots by it)."""

    logprobs_topk: int = Field(default=20, ge=1)
    """Top-k raw log-probs fetched per token, from which the behaviour log-prob is computed (see
    engines/vllm_engine.py for when that is exact)."""

    enforce_eager: bool = False
    """Skip torch.compile and CUDA graph capture. Starts tens of seconds sooner and decodes slower; for
    short-lived checks and debugging."""

    attention_backend: str = ""
    """Attention backend name (`FLASH_ATTN`, `TRITON_ATTN`, `FLEX_ATTENTION`, ...); "" lets vLLM choose.
    `TRITON_ATTN` needs no compiled attention library (head size >= 32)."""


EngineSettings = Annotated[
    Annotated[TransformersEngineSettings, Tag("transformers")] | Annotated[VllmEngineSettings, Tag("vllm")],
    kind_discriminator("transformers"),
]


class TenantQuota(BaseModel):
    """One tenant's quota override (`APPRENTICE_INFERENCE_QUOTA__TENANTS`); None keeps the pod default."""

    max_concurrent: int | None = Field(default=None, ge=0)
    tokens_per_s: float | None = Field(default=None, ge=0)
    burst_tokens: int | None = Field(default=None, ge=0)


class QuotaSettings(Group):
    """What one tenant may use of this pod (services/inference/quotas.py): over it, RESOURCE_EXHAUSTED (HTTP
    429) with the time to retry."""

    max_concurrent: int = Field(default=16, ge=0)
    """Samples one tenant may have in flight (queued + generating) on this pod, a request of `n` samples
    counting `n`; 0 = unlimited. On by default: without it one tenant's flood of concurrent requests held
    every HTTP worker and the scheduler's queue, and another tenant's latency went from 0.12 s to 21 s."""

    tokens_per_s: float = Field(default=2000.0, ge=0.0, json_schema_extra={"unit": "tokens/s"})
    """Token rate (prompt + generated tokens per second) one tenant may use on this pod, as a token bucket;
    0 = unlimited. On by default, above what one tenant gets from a pod's fair share of a small model."""

    burst_tokens: int = Field(default=0, ge=0)
    """Token bucket size (what a tenant may use at once after idling); 0 = 10 s of `tokens_per_s`."""

    tenants: dict[str, TenantQuota] = Field(default_factory=dict)
    """Per-tenant overrides of the three quotas above, as JSON: `{"acme": {"max_concurrent": 8,
    "tokens_per_s": 2000}}`; a field left out keeps the pod default."""


class FeedbackLimits(Group):
    """Caps on the feedback one interaction may receive on this pod (services/inference/feedback_guard.py);
    over them, RESOURCE_EXHAUSTED. A product sends a handful (a thumb, a KPI or two, a correction); a flood
    only grows the grader's state."""

    max_per_interaction: int = Field(default=32, ge=1)
    """Feedback events one interaction may receive on this pod."""

    max_bytes_per_interaction: int = Field(default=65_536, ge=1, json_schema_extra={"unit": "bytes"})
    """Total comment bytes per interaction on this pod (the grader keeps them in its join state)."""

    max_comment_chars: int = Field(default=8_192, ge=1)
    """Longest comment (a correction is a corrected answer, not a document)."""

    clock_skew_s: float = Field(default=300.0, ge=0.0)
    """How far `occurred_at` may lie before the interaction or after now (client clocks drift)."""


def _default_pod_id() -> str:
    # Stable across restarts (a pod's hostname in Kubernetes), so a restarted pod replays its own spool.
    return os.environ.get("HOSTNAME") or socket.gethostname()


class KnowledgeSettings(Group):
    """Approved knowledge items in each chat request's context (services/inference/knowledge.py), from
    approval until a promoted version answers the item's questions without it."""

    in_context: bool = True
    """Add the tenant's approved knowledge items relevant to each chat request to its context (inside the
    injection-safe frame of shared/knowledge/frame.py), from approval until a promoted version answers the
    item's questions without it. Per-tenant overrides in `tenants`."""

    tenants: dict[str, bool] = Field(default_factory=dict)
    """Per-tenant switch, as JSON: `{"acme": false}`; a tenant not named follows `in_context`."""

    max_tokens: int = Field(default=192, ge=1, le=4096)
    """Token budget of the items added to one request (their texts; the frame adds ~45 tokens)."""

    tenant_max_tokens: dict[str, int] = Field(default_factory=dict)
    """Per-tenant budgets overriding `max_tokens`, as JSON: `{"acme": 512}`."""

    max_items: int = Field(default=3, ge=1, le=32)
    """At most this many items per request (the most relevant first)."""

    min_score: float = Field(default=0.4, ge=-1.0, le=1.0)
    """Items scoring below this similarity to the request are not relevant and stay out (the larger of the
    all-MiniLM-L6-v2 cosine and the TF-IDF cosine; the TF-IDF-only fallback uses 0.2)."""

    margin: float = Field(default=0.2, ge=0.0, le=2.0)
    """Items scoring more than this below the best item for the request stay out: a small model reads one
    relevant note well and is distracted by weaker ones beside it."""

    retriever: Literal["minilm", "tfidf"] = "minilm"
    """`minilm`: the shipped sentence-embedding model (falls back to `tfidf`, with a warning, when its
    package is missing); `tfidf`: word overlap only."""


class InferenceSettings(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_INFERENCE_")

    common: CommonSettings = Field(default_factory=CommonSettings)

    # --- serving -----------------------------------------------------------------------------------
    host: str = ""
    """Interface the gRPC, HTTP and metrics servers bind; "" = every interface when keys are configured,
    loopback when not (shared/security/binding.py)."""

    port: int = 50051
    """gRPC port (docs/architecture.md §2); 0 picks a free port (tests)."""

    metrics_port: int = 9101
    """Prometheus endpoint; 0 disables it."""

    http_port: int = 8000
    """OpenAI-compatible HTTP API (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/models`,
    `/v1/feedback`; services/inference/openai_api/), on the same host, keys and TLS certificate as gRPC;
    8000 is vLLM's and most OpenAI-compatible servers' default. 0 disables it."""

    http_workers: int = 64
    """Threads that run HTTP requests' blocking steps (tokenising, waiting for the engine); like
    `grpc_workers`, this bounds the HTTP requests in flight per pod."""

    http_tenant_share: float = Field(default=0.25, gt=0.0, le=1.0)
    """Fraction of `http_workers` one tenant's HTTP requests may hold at once (at least 1); the rest of its
    requests wait in that tenant's own queue, so one tenant's burst never occupies every worker and another
    tenant's request starts at once. A tenant already waiting `HTTP_TENANT_QUEUE`x its share is answered 429
    with Retry-After (services/inference/openai_api/routes.py)."""

    grpc_workers: int = 64
    """Handler threads. Each waiting request holds one while the engine generates, so this bounds the
    number of requests in flight (queued + generating) per pod."""

    grace_s: float = 20.0
    """Graceful stop: in-flight generations get this long to finish before they are cancelled."""

    advertised_endpoint: str = ""
    """host:port reported in heartbeats (how operators reach this pod); "" = `<hostname>:<port>`."""

    pod_id: str = Field(default_factory=_default_pod_id)
    """Identifies this pod in heartbeats and in `Interaction.serving_pod`; names its state directory
    (spool, downloaded versions), so keep it stable across restarts and distinct per replica. Default:
    $HOSTNAME, else the host name (a pod's name in Kubernetes)."""

    api_keys: str = ""
    """Deprecated (use `APPRENTICE_AUTH_KEYS` backend entries): `key:tenant,key2:tenant2`, accepted as
    backend keys of those tenants."""

    default_tenant: str = "default"
    """Tenant of requests that name none (no `tenant` field, no `x-apprentice-tenant` metadata; a backend
    key always acts for its own tenant). `default` is also the tenant every other service gives data that
    names none (the trainer's `APPRENTICE_TRAINER_TENANT`, services/trainer/rollouts.py, the extractor's
    trajectories): keep them equal, so a single-tenant deployment never has to name a tenant."""

    feedback: FeedbackLimits = Field(default_factory=FeedbackLimits)
    """Caps on the feedback one interaction may receive on this pod."""

    # --- engine ------------------------------------------------------------------------------------
    engine: EngineSettings = Field(default_factory=TransformersEngineSettings)
    """Which engine generates: `kind` = transformers (CPU default, continuous batching) or vllm (GPU; needs
    the `gpu` extra), each with its own settings. In Python, `engine="vllm"` is short for `{"kind": "vllm"}`."""

    dtype: str = "float32"
    """Weights dtype (`float32`, `bfloat16`, `float16`); fp32 on CPU, where half precision is slow."""

    max_batch_rows: int = 32
    """Most sequences (requests x n) decoded together. Bounds the KV cache and the per-step latency."""

    batch_wait_ms: float = 4.0
    """How long the scheduler waits after the first queued request for others to join its batch: a few
    milliseconds cost a lone request ~1% of a typical generation and let concurrent ones share steps."""

    batch_refill_ms: float = 40.0
    """Up to this long, the scheduler waits for a batch to reach the previous batch's request count:
    under steady concurrency the clients of one batch resubmit a few milliseconds apart, and without
    this the next batch would start with the first of them and leave the rest for a batch of their own.
    Costs a lone request at most this once, when concurrency drops."""

    # --- scheduling and tenant quotas (services/inference/scheduler.py, quotas.py) -------------------
    scheduler: Literal["continuous", "static"] = "continuous"
    """Transformers engine: `continuous` (requests join the running batch at the next step and finished
    rows leave at once, within `max_batch_rows` / `max_batch_tokens`, tenants taking turns) or `static`
    (the batch formed at its start decodes to its end, as before; kept for comparison)."""

    max_batch_tokens: int = 32_768
    """Continuous scheduler: cap on the tokens the rows in flight may reserve, each row reserving its
    prompt + max new tokens (at most the context window). New rows wait rather than grow past it, so a
    request of n=16 x 2,000 tokens holds about one batch's worth, not the engine. The padded KV cache can
    reach rows x longest row; 32k tokens is ~1.5 GB of fp32 KV for SmolLM2-135M."""

    tenant_batch_share: float = 0.25
    """Continuous scheduler: fraction of `max_batch_rows` and `max_batch_tokens` one tenant's rows may
    hold while another tenant has work. Every row a tenant adds slows the steps of everyone's rows: on
    SmolLM2 a quarter (8 of 32 rows) keeps a short request within ~3x its idle latency beside an n=16
    load, where half gave 3.1-3.6x. A tenant alone may borrow the whole budget; when another arrives,
    the borrower's excess rows are preempted (recomputed later), so a lone tenant keeps static
    batching's throughput (load/fairness_bench.py, numbers in the inference README)."""

    prompt_cache_bytes: int = Field(default=256 << 20, ge=0)
    """Continuous scheduler: memory for recent prefills (keys, values and last logits of exact prompts,
    per tenant, set of weights and adapter), so a repeated prompt joins without a forward pass
    (shared/decoding/prompt_cache.py). ~2 MB per 44-token prompt on SmolLM2-135M; 0 turns it off."""

    tenant_borrow_after_s: float = Field(default=2.0, ge=0.0)
    """Continuous scheduler: a tenant may hold more than `tenant_batch_share` once every other tenant has
    been without work for this long. The pause keeps a tenant that sends one request after another
    (gaps of a few ms) from making the borrower give back and re-borrow its rows at each request."""

    fault_delay_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    """Tests and chaos drills only (`APPRENTICE_INFERENCE_FAULT_DELAY_S`): every generation request (gRPC
    and HTTP) waits this long before it is queued, as on an overloaded or restarting pod, or until its
    deadline passes (then DEADLINE_EXCEEDED). Callers that hold a Kafka consumer must ride it out
    without losing their group. 0 (the default) in production; the pod logs a warning when it is set."""

    max_overtake_s: float = 5.0
    """Continuous scheduler: how long smaller requests from other tenants may overtake a request that
    waits for room; after that, admission holds other rows until it fits (no starvation)."""

    quota: QuotaSettings = Field(default_factory=QuotaSettings)
    """Per-tenant quotas on this pod: pod defaults and per-tenant overrides."""

    # --- knowledge in context (services/inference/knowledge.py) -------------------------------------
    knowledge: KnowledgeSettings = Field(default_factory=KnowledgeSettings)
    """Which knowledge items go into a request's context: switches, budgets, relevance, retriever."""

    default_max_new_tokens: int = 128
    """Used when a request leaves `max_new_tokens` at 0."""

    max_new_tokens_limit: int = 2048
    """Largest `max_new_tokens` a request may ask for."""

    max_n: int = 16
    """Largest `n` (samples per request, for exploration groups); the contract allows 1-16."""

    max_stop_strings: int = 8
    """Most stop strings one request may name (request size limits are checked before tokenising: cheap
    rejection of abusive requests)."""

    max_stop_length: int = Field(default=64, json_schema_extra={"unit": "characters"})
    """Longest stop string."""

    max_messages: int = 256
    """Most chat messages in one request."""

    max_prompt_chars: int = 200_000
    """Longest prompt: its messages' characters together."""

    context_window: int = 0
    """Prompt + completion token limit; 0 = the model's `max_position_embeddings`."""

    adapter_cache_max_count: int = Field(default=64, ge=0)
    """Transformers engine: most LoRA adapters resident at once (0 = no count limit). Adapters are
    registered when their version loads and copied into memory when a request needs one; past this,
    the least recently used adapter without rows in flight is evicted (services/inference/adapter_cache.py)."""

    adapter_cache_max_bytes: int = Field(default=1 << 30, ge=0)
    """Transformers engine: memory the resident LoRA adapters may hold (their slots in the stacked
    tensors: rank x (in + out) per adapted layer; ~9.4 MiB for a rank-8 all-linear SmolLM2-135M adapter
    in fp32); 0 = no byte limit."""

    adapter_max_rank: int = Field(default=64, ge=1)
    """Transformers engine: highest LoRA rank accepted (every resident adapter is zero-padded to the
    highest rank present, so one high-rank adapter makes every slot larger)."""

    adapter_load_workers: int = Field(default=1, ge=1, le=16)
    """Transformers engine: background threads reading adapters from disk on demand."""

    # --- capture -----------------------------------------------------------------------------------
    capture: bool = True
    """Record every served choice as an `Interaction` (off = serve only)."""

    capture_disabled_tenants: str = ""
    """Comma-separated tenants whose traffic is never recorded (contractual opt-out)."""

    pii_policy: PiiPolicy = PiiPolicy.REDACT
    """What capture does with personal data (e-mails, phones, cards, IBANs, IPs, names, SSNs) in prompts,
    answers and feedback comments, before the spool and the topics: `redact` replaces each with a typed
    placeholder such as `<EMAIL_ADDRESS>`, `reject` refuses a request or comment that contains some
    (INVALID_ARGUMENT naming the types), `keep` captures text as it is. A captured request's prompt is
    redacted before it is served, so the model answers from the prompt it is recorded with; a request that
    is not captured is served as sent (README "PII redaction")."""

    pii_tenant_policies: str = ""
    """Per-tenant overrides of `pii_policy`: `tenantA:keep,tenantB:reject`."""

    spool_dir: Path | None = None
    """Capture spool (write-ahead log of events not yet acknowledged by Kafka); None =
    `<APPRENTICE_HOME>/inference/<pod_id>/spool`."""

    spool_max_bytes: int = 512 << 20
    """When undelivered events exceed this, new ones are dropped (alarm: metric + log), never a request."""

    spool_segment_bytes: int = 4 << 20
    """Spool file size before rotation; delivered segments are deleted whole."""

    capture_max_inflight: int = 2000
    """Events handed to the Kafka client but not yet acknowledged; the rest wait in the spool."""

    capture_delivery_timeout_ms: int = 120_000
    """librdkafka gives up on a record after this long; it is then re-sent from the spool."""

    capture_ack_timeout_s: float = Field(default=2.0, gt=0)
    """How long an acknowledgment (a Feedback ack, a Generate answer) waits for its event to reach the
    spool. A Feedback call whose event is not on disk by then fails UNAVAILABLE (its client retries with
    the same event id); an answer is returned anyway and the miss is counted
    (`apprentice_inference_capture_unspooled_total`)."""

    # --- hot swap ----------------------------------------------------------------------------------
    follow_updates: bool = True
    """Consume `model-updates` and hot-swap weights (off = serve the base model only)."""

    weights_endpoint: str = "127.0.0.1:50052"
    """Default `Weights` service address for downloads and heartbeats (an update may name another)."""

    heartbeat_interval_s: float = 3.0
    """How often the pod reports what it serves to the weights service; 0 disables heartbeats."""

    download_dir: Path | None = None
    """Where fetched versions are kept; None = `<APPRENTICE_HOME>/inference/<pod_id>/versions`."""

    download_timeout_s: float = 600.0
    """Deadline of one version's download from the weights service (a full model included)."""

    host_cache: bool = True
    """Share downloaded versions between the pods of one host (services/inference/host_cache.py): each
    version crosses the network once per host, the other pods hard-link it. Pods share the cache when
    they share `host_cache_dir` (by default, when they share APPRENTICE_HOME)."""

    host_cache_dir: Path | None = None
    """None = `<APPRENTICE_HOME>/inference/host-cache`."""

    host_cache_keep: int = Field(default=2, ge=1)
    """Versions per model the host cache keeps (most recently used); pods keep their own links."""

    startup_catchup_s: float = 10.0
    """At start, how long to wait for the model-updates backlog (the versions this pod should serve)
    before reporting SERVING; the backlog keeps applying in the background after that."""

    moved_settings: ClassVar[dict[str, str]] = {
        "engine": "engine.kind", "device": "engine.device",
        **{f"knowledge_{name}": f"knowledge.{name}" for name in ("in_context", "tenants", "max_tokens",
                                                                 "tenant_max_tokens", "max_items", "min_score",
                                                                 "margin", "retriever")},
        "tenant_max_concurrent": "quota.max_concurrent", "tenant_tokens_per_s": "quota.tokens_per_s",
        "tenant_burst_tokens": "quota.burst_tokens", "tenant_quotas": "quota.tenants",
        **{f"feedback_{name}": f"feedback.{name}" for name in ("max_per_interaction", "max_bytes_per_interaction",
                                                               "max_comment_chars", "clock_skew_s")},
        **{f"vllm_{name}": f"engine.{name}" for name in ("gpu_memory_utilization", "max_loras", "max_lora_rank",
                                                          "logprobs_topk", "enforce_eager", "attention_backend")}}

    # -----------------------------------------------------------------------------------------------
    @field_validator("engine", mode="before")
    @classmethod
    def _kind_alone(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v

    @field_validator("api_keys")
    @classmethod
    def _keys_parse(cls, v: str) -> str:
        for item in filter(None, (p.strip() for p in v.split(","))):
            key, sep, tenant = item.partition(":")
            if not sep or not key or not tenant:
                raise ValueError(f"APPRENTICE_INFERENCE_API_KEYS entry {item!r} must be `key:tenant`")
        return v

    @field_validator("pod_id")
    @classmethod
    def _pod_id_is_a_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
            raise ValueError(f"APPRENTICE_INFERENCE_POD_ID {v!r}: use letters, digits, '.', '_', '-' (it names a "
                             "directory)")
        return v

    @field_validator("pii_tenant_policies")
    @classmethod
    def _pii_policies_parse(cls, v: str) -> str:
        try:
            parse_tenant_policies(v)
        except ValueError as e:
            raise ValueError(f"APPRENTICE_INFERENCE_PII_TENANT_POLICIES: {e}") from None
        return v

    @model_validator(mode="after")
    def _check(self) -> InferenceSettings:
        if not 1 <= self.max_n <= 16:
            raise ValueError("APPRENTICE_INFERENCE_MAX_N must be within 1..16")
        if self.max_batch_rows < self.max_n:
            raise ValueError("APPRENTICE_INFERENCE_MAX_BATCH_ROWS must be >= MAX_N (one request's n rows "
                             "are always decoded together)")
        if self.default_max_new_tokens < 1 or self.default_max_new_tokens > self.max_new_tokens_limit:
            raise ValueError("APPRENTICE_INFERENCE_DEFAULT_MAX_NEW_TOKENS must be within 1..MAX_NEW_TOKENS_LIMIT")
        if self.batch_wait_ms < 0 or self.batch_refill_ms < 0 or self.grace_s < 0:
            raise ValueError("APPRENTICE_INFERENCE_BATCH_WAIT_MS, BATCH_REFILL_MS and GRACE_S must be >= 0")
        if self.max_batch_tokens < 1 or not 0 < self.tenant_batch_share <= 1 or self.max_overtake_s < 0:
            raise ValueError("APPRENTICE_INFERENCE_MAX_BATCH_TOKENS must be >= 1, TENANT_BATCH_SHARE within "
                             "(0, 1] and MAX_OVERTAKE_S >= 0")
        if not 0 <= self.http_port <= 65535 or self.http_workers < 1:
            raise ValueError("APPRENTICE_INFERENCE_HTTP_PORT must be within 0..65535 (0 = off) and "
                             "APPRENTICE_INFERENCE_HTTP_WORKERS >= 1")
        if self.spool_segment_bytes > self.spool_max_bytes:
            raise ValueError("APPRENTICE_INFERENCE_SPOOL_SEGMENT_BYTES must be <= SPOOL_MAX_BYTES")
        return self

    @property
    def vllm(self) -> VllmEngineSettings:
        """The vLLM engine's settings (its defaults when another engine is chosen)."""
        return self.engine if isinstance(self.engine, VllmEngineSettings) else VllmEngineSettings(kind="vllm")

    @property
    def torch_device(self) -> str:
        """The transformers engine's torch device (vLLM places its model itself)."""
        return self.engine.device if isinstance(self.engine, TransformersEngineSettings) else "cpu"

    @property
    def keys(self) -> dict[str, str]:
        """Deprecated API key -> tenant."""
        out = {}
        for item in filter(None, (p.strip() for p in self.api_keys.split(","))):
            key, _, tenant = item.partition(":")
            out[key.strip()] = tenant.strip()
        return out

    def legacy_key_entries(self) -> list[KeyEntry]:
        """The deprecated `api_keys` as backend key-ring entries (key id `inference-api-key-<n>`)."""
        return [KeyEntry(Identity(key_id=f"inference-api-key-{n}", role=Role.BACKEND, tenant=tenant),
                         digest=hashlib.sha256(key.encode()).digest())
                for n, (key, tenant) in enumerate(self.keys.items(), start=1)]

    def pii_policy_for(self, tenant: str) -> PiiPolicy:
        """The tenant's override, else `pii_policy`."""
        return parse_tenant_policies(self.pii_tenant_policies).get(tenant, self.pii_policy)

    def knowledge_on_for(self, tenant: str) -> bool:
        """The tenant's switch for knowledge in context."""
        return self.knowledge.tenants.get(tenant, self.knowledge.in_context)

    def knowledge_budget_for(self, tenant: str) -> int:
        return self.knowledge.tenant_max_tokens.get(tenant, self.knowledge.max_tokens)

    @property
    def no_capture_tenants(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.capture_disabled_tenants.split(",") if t.strip())

    @property
    def state_dir(self) -> Path:
        return self.common.home / "inference" / self.pod_id

    @property
    def spool_path(self) -> Path:
        return self.spool_dir or self.state_dir / "spool"

    @property
    def host_cache_path(self) -> Path:
        return self.host_cache_dir or self.common.home / "inference" / "host-cache"

    @property
    def versions_path(self) -> Path:
        return self.download_dir or self.state_dir / "versions"
