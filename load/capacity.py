"""Capacity on paper: the pods, workers, partitions and brokers a deployment needs at a request rate, from
the per-component rates this repository's benchmarks measured (each `MEASURED` entry names its source)
and the stated assumptions (`Assumptions`: the answer length, feedback per request, headroom).

    .venv/bin/python load/capacity.py [--rps 100,1000,10000] [--tokens-per-answer 64] [--gpu-tokens-per-s 6200]
                                      [--write-helm deploy/helm/apprentice/capacity]

Prints the table of docs/capacity.md; `--write-helm` writes the chart's overlays `<rps>rps.yaml` with the
same counts (tests/unit/load/test_capacity.py checks that the committed ones agree with `size`).

The model is deliberately simple: every stage is sized by the resource its benchmark showed to be its
limit (the model's tokens/s for inference, CPU per record for the grader and the broker, bytes retained
for the broker's disks), at a target utilisation that leaves headroom for a lost pod or broker.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

MEASURED: dict[str, tuple[float, str]] = {
    # name: (value, where it was measured)
    "cpu_pod_tokens_per_s": (41.0, "services/inference/README.md, load/fairness_bench.py throughput row: "
                                   "SmolLM2-135M, continuous batching, 16 clients, 2-core VM"),
    "grader_cpu_us_per_record": (446.0, "services/grader/README.md, load/grader_bench.py: 308-446 us of CPU per "
                                        "graded record, one worker (the high end)"),
    "broker_cpu_us_per_record": (198.0, "services/grader/README.md, load/grader_bench.py: 147-198 us of broker "
                                        "CPU per graded record (join, changelog, graded, confirmation; RF 1)"),
    "interaction_kb": (1.4, "load/grader_bench.py: an interaction with 120 response tokens and both log-prob "
                            "arrays"),
    "full_checkpoint_mb": (538.0, "services/weights/README.md: SmolLM2-135M safetensors"),
    "download_s_per_full_checkpoint": (0.92, "services/weights/README.md, load/weights_download_bench.py: "
                                             "durable download, 2 cores"),
    "cpu_trainer_samples_per_s": (16 / 12.5, "docs/demo.md sweep: 12.5 s per GRPO step of 16 samples, full "
                                             "fine-tuning, SmolLM2, 2-core CPU"),
}
"""Per-component rates from this repository's benchmarks."""


def measured(name: str) -> float:
    return MEASURED[name][0]


@dataclass(frozen=True)
class Assumptions:
    tokens_per_answer: int = 64
    """Mean new tokens per request (the demo's answers are 42-48)."""
    feedback_per_request: float = 1.0
    """Feedback or KPI events per request; each passes the grader's join like an interaction (counted as a
    whole record: an upper bound, a feedback event is ~10x smaller)."""
    utilisation: float = 0.6
    """Target load of every sized resource: room for a lost pod, broker or zone and for bursts."""
    gpu_tokens_per_s: float = 6200.0
    """Output tokens/s of one GPU inference pod. Not measured here (no GPU has run vLLM for this project):
    the default is vLLM's published H100 figure for an 8B model at 256 in / 256 out (24.3 req/s, half of
    12,453 tokens/s being output), an upper bound on the pods for any policy up to 8B. Replace it with
    `load/inference_vllm_gpu.py`'s figure for the deployed model."""
    replication_factor: int = 3
    retention_days: float = 7.0
    """The stream topics' retention (shared/contracts/topics.py: a week)."""
    broker_cores: int = 4
    broker_disk_tb: float = 4.0
    min_brokers: int = 3
    gpus_per_host: int = 8
    """Inference pods (one GPU each) per machine: a promotion downloads once per machine (host cache)."""
    graded_kb: float = 1.5
    """A graded record carries the interaction's tokens and log-probs for the trainer."""
    feedback_kb: float = 0.2


@dataclass(frozen=True)
class Sizing:
    rps: int
    gpu_inference_pods: int
    cpu_inference_pods: int
    grader_workers: int
    stream_partitions: int
    brokers: int
    broker_storage_gb: int
    """Per broker: the stream topics' retained bytes × RF, spread over the brokers."""
    cluster_write_mb_per_s: float
    """Bytes written to the brokers' logs per second, all replicas."""
    broker_bound: str
    """What sets the broker count: "replication" (the 3 that RF 3 needs), "CPU" or "disk"."""
    full_promotion_s: float
    """One full checkpoint (SmolLM2's 538 MB) to every GPU machine from one weights server, one download after
    another (a machine downloads once: services/inference/host_cache.py); a LoRA adapter is ~1/150 of it."""
    trained_fraction_cpu: float
    """Share of the traffic one CPU trainer can train on; the rest is graded and kept, not trained."""


def _pods(load: float, capacity: float, utilisation: float) -> int:
    return max(1, math.ceil(load / (capacity * utilisation)))


def size(rps: int, a: Assumptions | None = None) -> Sizing:
    """The counts at `rps` requests/s. Each is ceil(load / (capacity × utilisation)):

    inference pods = rps · tokens_per_answer / (tokens_per_s_per_pod · u)
    grader workers = rps · (1 + feedback) · grader_us / (1e6 · u), at least 2 (one may die)
    partitions     = the smallest multiple of 6 >= 1.5 · workers (room to add workers: Kafka cannot shrink)
    broker cores   = rps · (1 + feedback) · broker_us · RF / 1e6 (each replica does a leader's log work)
    brokers        = max(3, broker cores / (cores per broker · u), stored bytes / (disk per broker · u))
    stored bytes   = rps · (interaction + feedback + graded) · RF · retention
    """
    a = a or Assumptions()
    u = a.utilisation
    events = rps * (1 + a.feedback_per_request)
    gpu = _pods(rps * a.tokens_per_answer, a.gpu_tokens_per_s, u)
    cpu = _pods(rps * a.tokens_per_answer, measured("cpu_pod_tokens_per_s"), u)
    workers = max(2, _pods(events * measured("grader_cpu_us_per_record"), 1e6, u))
    partitions = max(6, 6 * math.ceil(1.5 * workers / 6))
    # bytes written per request to the brokers' logs, before replication: the interaction (to its topic, the
    # grader's join topic and its changelog), the feedback (topic and join) and the graded record
    kb = 3 * measured("interaction_kb") + 2 * a.feedback_kb * a.feedback_per_request + a.graded_kb
    write_mb = rps * kb * a.replication_factor / 1000
    retained_kb = (measured("interaction_kb") + a.feedback_kb * a.feedback_per_request + a.graded_kb)
    stored_gb = rps * retained_kb * a.replication_factor * a.retention_days * 86400 / 1e6
    broker_cpu = events * measured("broker_cpu_us_per_record") * a.replication_factor / 1e6
    by = {"replication": a.min_brokers, "CPU": math.ceil(broker_cpu / (a.broker_cores * u)),
          "disk": math.ceil(stored_gb / (a.broker_disk_tb * 1000 * u))}
    bound = max(by, key=lambda k: by[k])
    brokers = by[bound]
    promotion = math.ceil(gpu / a.gpus_per_host) * measured("download_s_per_full_checkpoint")
    trained = min(1.0, measured("cpu_trainer_samples_per_s") / rps)
    return Sizing(rps=rps, gpu_inference_pods=gpu, cpu_inference_pods=cpu, grader_workers=workers,
                  stream_partitions=partitions, brokers=brokers,
                  broker_storage_gb=math.ceil(stored_gb / brokers / u), cluster_write_mb_per_s=round(write_mb, 1),
                  broker_bound=bound, full_promotion_s=round(promotion, 1), trained_fraction_cpu=trained)


def helm_overlay(s: Sizing) -> dict[str, object]:
    """The chart's values for `s` (GPU inference; Strimzi's settings apply when it runs the cluster)."""
    return {"inference": {"replicas": s.gpu_inference_pods, "engine": "vllm", "device": "cuda", "dtype": "bfloat16",
                          "gpus": 1},
            "grader": {"replicas": s.grader_workers},
            "kafka": {"streamPartitions": s.stream_partitions,
                      "strimzi": {"replicas": s.brokers, "storage": {"size": f"{s.broker_storage_gb}Gi"}}}}


def table(rows: list[Sizing]) -> str:
    head = ["requests/s", "GPU inference pods", "CPU inference pods", "grader workers", "stream partitions",
            "brokers (set by)", "storage per broker", "log writes (all replicas)", "full promotion", "trained on (1 CPU trainer)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        lines.append(f"| {s.rps:,} | {s.gpu_inference_pods:,} | {s.cpu_inference_pods:,} | {s.grader_workers} | "
                     f"{s.stream_partitions} | {s.brokers} ({s.broker_bound}) | {s.broker_storage_gb:,} GB | "
                     f"{s.cluster_write_mb_per_s:,} MB/s | {s.full_promotion_s:,} s | {s.trained_fraction_cpu:.2%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rps", default="100,1000,10000")
    defaults = Assumptions()
    for f, v in asdict(defaults).items():
        ap.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--write-helm", type=Path, default=None, metavar="DIR")
    ns = ap.parse_args(argv)
    a = Assumptions(**{f: getattr(ns, f) for f in asdict(defaults)})
    rows = [size(int(r), a) for r in ns.rps.split(",")]
    print(table(rows))
    if ns.write_helm is not None:
        ns.write_helm.mkdir(parents=True, exist_ok=True)
        for s in rows:
            path = ns.write_helm / f"{s.rps}rps.yaml"
            path.write_text(f"# docs/capacity.md at {s.rps:,} requests/s (written by load/capacity.py)\n"
                            + yaml.safe_dump(helm_overlay(s), sort_keys=False), encoding="utf-8")
    print("\nmeasured inputs:")
    for name, (value, source) in MEASURED.items():
        print(f"- {name} = {value:g}: {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
