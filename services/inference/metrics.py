"""Prometheus metrics of the inference service (served on :9101/metrics by default).

Module-level collectors in the default registry: several servers in one process (tests) share them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from shared.contracts.metric_names import INFERENCE_SPOOL_DEPTH

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter("apprentice_inference_requests_total", "gRPC calls by method and status code",
                   ["method", "code"])
LATENCY = Histogram("apprentice_inference_request_seconds", "End-to-end latency of a call", ["method"],
                    buckets=_LATENCY_BUCKETS)
TIME_TO_FIRST_TOKEN = Histogram("apprentice_inference_time_to_first_token_seconds",
                                "Submission to first generated token", buckets=_LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram("apprentice_inference_queue_seconds", "Time a request waited for its batch",
                          buckets=_LATENCY_BUCKETS)
QUEUE_DEPTH = Gauge("apprentice_inference_queue_depth", "Requests waiting for a batch")
BATCH_ROWS = Histogram("apprentice_inference_batch_rows", "Sequences decoded together per batch",
                       buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64))
BATCH_REQUESTS = Histogram("apprentice_inference_batch_requests", "Requests per batch",
                           buckets=(1, 2, 4, 8, 12, 16, 24, 32))
GENERATED_TOKENS = Counter("apprentice_inference_generated_tokens_total", "Tokens generated", ["version"])
TOKENS_PER_SECOND = Gauge("apprentice_inference_tokens_per_second", "Decode throughput of the last batch")
SERVED = Counter("apprentice_inference_choices_total", "Choices served, by version and canary flag",
                 ["version", "canary"])
SERVED_VERSION = Gauge("apprentice_inference_served_version",
                       "1 for each (tenant slot, version, role) this pod serves now", ["tenant", "version", "role"])
MODEL_LOADED = Gauge("apprentice_inference_model_loaded", "1 once the base model serves")

SWAPS = Counter("apprentice_inference_version_loads_total", "Version loads by outcome", ["outcome"])
LOAD_SECONDS = Histogram("apprentice_inference_version_load_seconds", "Download + load time of a version",
                         buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
HEARTBEAT_FAILURES = Counter("apprentice_inference_heartbeat_failures_total", "Heartbeats that failed")

CAPTURED = Counter("apprentice_inference_capture_delivered_total", "Events acknowledged by Kafka", ["topic"])
CAPTURE_DROPPED = Counter("apprentice_inference_capture_dropped_total",
                          "Events dropped because the spool was full (alarm)")
CAPTURE_UNSPOOLED = Counter("apprentice_inference_capture_unspooled_total",
                            "Answers returned before their interaction reached the spool (a busy or full spool)")
CAPTURE_SKIPPED = Counter("apprentice_inference_capture_skipped_total",
                          "Choices not recorded by request or tenant opt-out", ["reason"])
TRAJECTORY_TURNS = Counter("apprentice_inference_trajectory_turns_total",
                           "Captured turns by what they are of an agent trajectory (services/inference/trajectory.py):"
                           " continued (a later turn), by_history (continued, found without a session id), first",
                           ["outcome"])
TRAJECTORY_TOKENS = Counter("apprentice_inference_trajectory_tokens_total",
                            "Tokens of the earlier turns in captured trajectories: model (the policy's samples),"
                            " environment (masked in training), realigned (samples found again after an edit)",
                            ["kind"])
SPOOL_DEPTH = Gauge(INFERENCE_SPOOL_DEPTH, "Events written to the spool, not yet acknowledged")
SPOOL_BYTES = Gauge("apprentice_inference_spool_bytes", "Bytes of spool files on disk")
SPOOL_FULL = Gauge("apprentice_inference_spool_full", "1 while the spool refuses new events")
CAPTURE_BROKER_UP = Gauge("apprentice_inference_capture_broker_up",
                          "0 while deliveries are failing or stalled")
PII_FOUND = Counter("apprentice_inference_pii_entities_total",
                    "Personal-data spans found in captured text, by type and where (prompt|response|feedback|"
                    "tool_arguments|tool_definitions)",
                    ["entity", "where"])
PII_REDACTED = Counter("apprentice_inference_pii_redacted_total", "Captured events whose text was redacted",
                       ["kind"])
PII_REJECTED = Counter("apprentice_inference_pii_rejected_total",
                       "Requests or comments refused for personal data (tenant policy `reject`)", ["kind"])
PII_SCAN_SECONDS = Histogram("apprentice_inference_pii_scan_seconds", "One PII scan of one text (cache hits "
                             "included)", buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))

QUOTA_REFUSED = Counter("apprentice_inference_quota_refused_total",
                        "Requests refused by a tenant quota (RESOURCE_EXHAUSTED / HTTP 429)", ["reason"])
PROMPT_CACHE_HITS = Counter("apprentice_inference_prompt_cache_hits_total",
                            "Prompts joined from the prompt cache, without a prefill forward pass")
PREEMPTED_ROWS = Counter("apprentice_inference_preempted_rows_total",
                         "Rows taken out of a batch unfinished to give a borrowed share back (recomputed later)")
ROWS_IN_FLIGHT = Gauge("apprentice_inference_rows_in_flight",
                       "Continuous scheduler: sequences admitted into running batches")
TOKENS_RESERVED = Gauge("apprentice_inference_batch_tokens_reserved",
                        "Continuous scheduler: tokens reserved by the rows in flight (cap: max_batch_tokens)")

ADAPTERS_RESIDENT = Gauge("apprentice_inference_adapters_resident",
                          "LoRA adapters resident in memory now (transformers engine; budget: adapter_cache_max_*)")
ADAPTER_RESIDENT_BYTES = Gauge("apprentice_inference_adapter_resident_bytes",
                               "Slot memory held by the resident LoRA adapters")
ADAPTER_LOADS = Counter("apprentice_inference_adapter_loads_total",
                        "LoRA adapters made resident on demand (loaded), or whose load failed", ["outcome"])
ADAPTER_EVICTIONS = Counter("apprentice_inference_adapter_evictions_total",
                            "Resident LoRA adapters evicted, least recently used first, to make room")
ADAPTER_LOAD_SECONDS = Histogram("apprentice_inference_adapter_load_seconds",
                                 "From a request finding its LoRA adapter absent to the adapter being resident",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

KNOWLEDGE_ITEMS = Gauge("apprentice_inference_knowledge_servable_items",
                        "Approved knowledge items this pod can put in a prompt's context, all tenants")
KNOWLEDGE_IN_CONTEXT = Counter("apprentice_inference_knowledge_requests_total",
                               "Chat requests whose context received knowledge items (added), or whose relevant "
                               "items did not fit the context window (no_room)", ["outcome"])
