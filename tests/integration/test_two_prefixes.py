"""Two stacks with different topic prefixes on one secured broker, at the same time: both loops grade and
train, each only its own (#51).

Each stack (tools/stack `LocalStack`, tiny model) runs inference, the grader, the trainer and the weights
service as real processes, each logged in as its own principal of the access table, with only the ACLs of its
stack's prefix (applied by the stack as the broker's admin, as `apprentice up` does). The two stacks serve the
same tenant and task, so nothing but the prefix keeps them apart. Load goes to both; then, per stack: every
answer it served was graded in its own graded topic and none of the other's; its trainer trained a version
from its own interactions only and announced it on its own checkpoints topic; no process was refused anything
by the broker.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from load.loadgen import LoadGenerator, Stats
from shared.contracts.events import decode
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.chaos import EVAL_HELDOUT, EVAL_OOD, GRADER_CONFIG
from tests.helpers.kafka import read_to_end
from tests.helpers.waiting import wait_for
from tools.stack.stack import LocalStack

pytestmark = pytest.mark.integration

TENANT = "demo"
SERVICES = ("weights", "inference", "grader", "trainer")
"""The loop: served, graded, trained, gated and stored (the extractor and the dashboard add nothing here)."""
REQUESTS = 6
TRIGGER = 4
"""Graded samples per training round: one round from each stack's six answers."""


def stack_env(run_dir: Path) -> dict[str, dict[str, str]]:
    """Every answer graded at once by its KPI, RL-only rounds of `TRIGGER` samples, the gate on small sets."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "grader.yaml").write_text(GRADER_CONFIG.format(window=600))
    (run_dir / "eval-heldout.yaml").write_text(EVAL_HELDOUT)
    (run_dir / "eval-ood.yaml").write_text(EVAL_OOD)
    one = {"APPRENTICE_TORCH_THREADS": "1"}
    return {
        "inference": one,
        "grader": {"APPRENTICE_GRADER_CONFIG_PATH": str(run_dir / "grader.yaml"), **one},
        "trainer": {"APPRENTICE_TRAINER_TENANT": TENANT, "APPRENTICE_TRAINER_RL_ENABLED": "true",
                    "APPRENTICE_TRAINER_DISTILL_ENABLED": "false", "APPRENTICE_TRAINER_TRIGGER_SAMPLES": str(TRIGGER),
                    "APPRENTICE_TRAINER_BATCH_SIZE": str(TRIGGER), "APPRENTICE_TRAINER_MICRO_BATCH_SIZE": str(TRIGGER),
                    **one},
        "weights": {"APPRENTICE_WEIGHTS_POLICY": "auto", "APPRENTICE_WEIGHTS_EVAL_SET": str(run_dir / "eval-heldout.yaml"),
                    "APPRENTICE_WEIGHTS_OOD_SET": str(run_dir / "eval-ood.yaml"),
                    "APPRENTICE_WEIGHTS_EVAL_MAX_NEW_TOKENS": "16", **one},
    }


def load(stack: LocalStack, out: dict[str, Stats], name: str) -> None:
    gen = LoadGenerator(stack.inference_target, "support_desk", [TENANT], max_new_tokens=8, feedback_rate=1.0,
                        feedback_delay_s=0.2, timeout_s=60.0, retry_s=30.0, seed={"a": 1, "b": 2}[name],
                        common=stack.client_common)
    try:
        out[name] = gen.run(duration_s=300, concurrency=2, qps=0, max_requests=REQUESTS)
    finally:
        gen.close()


def records(bootstrap: str, topic: str, msg_type: Any) -> list[Any]:
    return [decode(msg_type, m.value()) for m in read_to_end(bootstrap, topic)]


def test_two_prefixes_on_one_broker_each_grade_and_train_only_their_own(kafka_bootstrap: str, tiny_model_name: str,
                                                                         tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    run = uuid.uuid4().hex[:8]
    stacks = {name: LocalStack(tmp_path / name, tiny_model_name, prefix=f"test-two-{name}-{run}.", secure=False,
                               services=SERVICES, service_env=stack_env(tmp_path / name))
              for name in ("a", "b")}
    try:
        for s in stacks.values():
            s.start()
        for name, s in stacks.items():
            health = s.wait_healthy(300)
            assert all(health.values()), (name, health, s.crashed())

        stats: dict[str, Stats] = {}
        threads = [threading.Thread(target=load, args=(s, stats, name)) for name, s in stacks.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        served = {name: set(stats[name].served) for name in stacks}
        assert all(len(ids) == REQUESTS for ids in served.values()), {n: len(i) for n, i in served.items()}
        assert not served["a"] & served["b"]

        # both loops grade their own answers, and only those
        def graded(name: str) -> set[str]:
            return {g.interaction.interaction_id for g in
                    records(kafka_bootstrap, stacks[name].topics.graded, events_pb2.GradedInteraction)}
        for name in stacks:
            def all_graded(name: str = name) -> bool:
                return graded(name) >= served[name]
            wait_for(all_graded, what=f"stack {name}'s answers graded", stall_s=180, every=1.0)
            assert graded(name) == served[name], name

        # both loops train, each on its own graded records: a version announced on its own checkpoints topic
        def announced(name: str) -> list[Any]:
            return records(kafka_bootstrap, stacks[name].topics.checkpoints, events_pb2.CheckpointPublished)
        for name in stacks:
            def published_one(name: str = name) -> bool:
                return bool(announced(name))
            wait_for(published_one, what=f"stack {name}'s trainer to publish a version", stall_s=300, every=2.0)
        for name, s in stacks.items():
            trainer_dir = s.run_dir / "trainer" / TENANT
            published = json.loads((trainer_dir / "published.json").read_text())
            assert {c.version for c in announced(name)} <= {p["version"] for p in published.values()}, name
            trained: set[str] = set()
            for ckpt_id in published:
                trained |= set(json.loads((trainer_dir / "ckpts" / ckpt_id / "state.json").read_text())["trained_ids"])
            assert trained and trained <= served[name], (name, trained - served[name])

        # every process ran as its own principal with its prefix's grants: the broker refused none of them
        for name, s in stacks.items():
            assert not s.crashed(), (name, s.crashed())
            for log in (s.run_dir / "logs").glob("*.log"):
                assert "the Kafka broker refuses" not in log.read_text(errors="replace"), (name, log.name)
    finally:
        for s in stacks.values():
            s.stop(grace=10.0)
