"""Prometheus metrics of the extractor (served on :9103/metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

TRAJECTORIES = Counter("apprentice_extractor_trajectories_total", "Closed trajectories by outcome", ["outcome"])
ITEMS = Counter("apprentice_extractor_items_total", "Candidate items by curation verdict", ["verdict"])
SNAPSHOTS = Counter("apprentice_extractor_snapshots_total", "Knowledge snapshots published")
LLM_CALLS = Counter("apprentice_extractor_llm_calls_total", "Extraction requests sent to the LLM")
LLM_ERRORS = Counter("apprentice_extractor_llm_unavailable_total", "Batches left for later: LLM unavailable")
OPEN_SESSIONS = Gauge("apprentice_extractor_open_sessions", "Sessions collecting turns")
