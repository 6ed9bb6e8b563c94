"""load/capacity.py: the sizing formulas against a hand-computed case, and the chart's capacity overlays
agree with them (a changed measurement or assumption that is not carried to the overlays fails here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from load.capacity import Assumptions, helm_overlay, size

OVERLAYS = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "apprentice" / "capacity"


def test_sizing_at_1000_requests_per_second_by_hand() -> None:
    s = size(1000)
    # 1000 req/s x 64 tokens / (6200 tokens/s x 0.6) = 17.2 -> 18 GPU pods; / (41 x 0.6) = 2601.6 -> 2602 CPU pods
    assert (s.gpu_inference_pods, s.cpu_inference_pods) == (18, 2602)
    # 2000 events/s x 446 us = 0.892 cores / 0.6 = 1.49 -> 2 workers; 1.5 x 2 = 3 -> 6 partitions (the floor)
    assert (s.grader_workers, s.stream_partitions) == (2, 6)
    # (1.4 + 0.2 + 1.5) kB x 3 replicas x 7 days x 1000/s = 5,624.6 GB: 3 brokers of 4 TB at 60% hold it
    assert (s.brokers, s.broker_bound, s.broker_storage_gb) == (3, "replication", 3125)
    # (3 x 1.4 + 2 x 0.2 + 1.5) kB x 3 x 1000/s = 18.3 MB/s; 3 GPU machines x 0.92 s
    assert (s.cluster_write_mb_per_s, s.full_promotion_s) == (18.3, 2.8)


def test_the_limits_move_with_the_load() -> None:
    small, big = size(100), size(10_000)
    assert small.grader_workers == 2 and small.brokers == 3          # the floors: one worker or broker may die
    assert big.broker_bound == "disk" and big.brokers > 3             # a week of 10,000/s outgrows 3 disks
    assert big.stream_partitions >= big.grader_workers and big.stream_partitions % 6 == 0
    short = size(10_000, Assumptions(retention_days=1))
    assert short.brokers < big.brokers                                # retention is the lever on the disks


def test_the_charts_capacity_overlays_are_the_sizing() -> None:
    files = sorted(OVERLAYS.glob("*rps.yaml"))
    assert {f.name for f in files} == {"100rps.yaml", "1000rps.yaml", "10000rps.yaml"}
    for f in files:
        rps = int(f.name.removesuffix("rps.yaml"))
        assert yaml.safe_load(f.read_text(encoding="utf-8")) == helm_overlay(size(rps)), \
            f"{f.name} differs from load/capacity.py: rerun it with --write-helm {OVERLAYS.relative_to(OVERLAYS.parents[3])}"
