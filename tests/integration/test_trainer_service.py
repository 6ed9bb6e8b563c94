"""The trainer service end to end on real parts: Kafka broker, Weights service over loopback gRPC, tiny model.

graded + knowledge records of two tenants --> one GRPO version and one OEL version for tenant acme only,
uploaded (chunked, sha256) and announced on the checkpoints topic.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.trainer.loop import TrainerService
from services.trainer.rounds import RoundResult
from services.trainer.service import CHANNEL_OPTIONS
from services.trainer.settings import TensorBoardSettings, TrainerSettings
from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.kafka.trust import RecordTrust
from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc
from shared.settings import CommonSettings
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer
from tests.unit.trainer.factories import graded, snapshot

pytestmark = pytest.mark.integration
MODEL = "tiny-random"


@pytest.fixture
def weights(tmp_path: Path) -> Iterator[tuple[int, weights_pb2_grpc.WeightsStub]]:
    """The real Weights service (store on tmp, no checkpoint consumer / eval gate)."""
    from services.weights.service import start
    from services.weights.settings import LocalStoreSettings, WeightsSettings

    running = start(WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"),
                                    policy="manual"), consume=False)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    yield running.port, weights_pb2_grpc.WeightsStub(channel)
    channel.close()
    running.stop(grace=1.0)


def produce_traffic(bootstrap: str, topics: Topics, tok: Any, n_groups: int = 2, singles: int = 3,
                    seed: int = 0, tag: str = "") -> dict[str, list[str]]:
    """acme: exploration groups of 4 + singles + one quarantined + one no-signal; globex: 4 records."""
    rng = random.Random(seed)
    prompt = tok("<|im_start|>user\nhow long is the warranty?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    recs, acme = [], []
    for g in range(n_groups):
        for k in range(4):
            iid = f"acme{tag}-g{g}-{k}"
            recs.append(graded(iid, group=f"G{tag}{g}", group_size=4, reward=float(k % 2), prompt=prompt,
                               response=[rng.randrange(200, 40000) for _ in range(rng.randrange(3, 8))]))
            acme.append(iid)
    for s in range(singles):
        iid = f"acme{tag}-s{s}"
        recs.append(graded(iid, reward=rng.choice([-1.0, 1.0]), prompt=prompt, response=[300 + s, 301, 302]))
        acme.append(iid)
    recs.append(graded(f"acme{tag}-q", quarantined=True, prompt=prompt))
    recs.append(graded(f"acme{tag}-n", has_signal=False, prompt=prompt))
    globex = [f"globex{tag}-{i}" for i in range(4)]
    recs += [graded(i, tenant="globex", prompt=prompt, question="globex secret question") for i in globex]
    p = signed_producer(bootstrap, "grader")          # graded records are the grader's
    for r in recs:
        p.produce(topics.graded, r.interaction.session_id, r)
    p.flush()
    p = signed_producer(bootstrap, "extractor")       # snapshots the extractor's
    p.produce(topics.knowledge, "acme/support", snapshot("acme", "support", 1, [
        ("The warranty lasts 14 months.", events_pb2.ITEM_STATUS_APPROVED),
        ("Returns need form R-22.", events_pb2.ITEM_STATUS_PINNED),
        ("Unreviewed guess.", events_pb2.ITEM_STATUS_PROPOSED)]))
    p.produce(topics.knowledge, "globex/support", snapshot("globex", "support", 1, [
        ("globex internal rule", events_pb2.ITEM_STATUS_APPROVED)]))
    p.flush()
    return {"acme": acme, "globex": globex}


def test_service_trains_one_tenant_uploads_and_announces(topics: Topics, kafka_bootstrap: str, tmp_path: Path,
                                                         weights, tiny_model_name: str) -> None:  # noqa: ANN001
    from shared.models import load_tokenizer

    port, stub = weights
    ids = produce_traffic(kafka_bootstrap, topics, load_tokenizer(tiny_model_name))
    junk = signed_producer(kafka_bootstrap, "grader")    # signed by its writer: refused for its bytes alone
    junk.produce(topics.graded, "junk", b"\x08\x96\x01not a graded interaction")   # poison record
    junk.flush()
    settings = TrainerSettings(
        common=CommonSettings(model=MODEL), tenant="acme", state_dir=tmp_path / "trainer", metrics_port=0,
        weights_endpoint=f"127.0.0.1:{port}", trigger_samples=8, lr=1e-3, batch_size=8, micro_batch_size=4,
        distill_batch=2, distill_steps=1, distill_max_new_tokens=4,
        experiment_log=TensorBoardSettings(kind="tensorboard"))
    from prometheus_client import REGISTRY

    def steps_total(algorithm: str) -> float:
        return REGISTRY.get_sample_value("apprentice_trainer_optimizer_steps_total", {"algorithm": algorithm}) or 0.0

    grpo_steps_before, oel_steps_before = steps_total("grpo"), steps_total("oel")
    svc = TrainerService(settings, stub)
    algorithms: list[str] = []
    deadline = time.monotonic() + 180
    try:
        while len(algorithms) < 2 and time.monotonic() < deadline:
            svc.poll(timeout=0.5)
            r = svc.maybe_train()
            if r is not None:
                algorithms.append(r.algorithm)
    finally:
        svc.close()
    assert algorithms == ["grpo", "oel"]

    # per-step metrics: Prometheus counters and last-step gauges, and the TensorBoard log under the state dir
    grpo_steps, oel_steps = steps_total("grpo") - grpo_steps_before, steps_total("oel") - oel_steps_before
    assert grpo_steps >= 1 and oel_steps == 1
    assert REGISTRY.get_sample_value("apprentice_trainer_lifetime_steps") == svc.trainer.policy.steps == grpo_steps + 1
    assert (REGISTRY.get_sample_value("apprentice_trainer_response_length_tokens", {"algorithm": "grpo"}) or 0) > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "trainer" / "runs")).Reload()
    assert [e.step for e in board.Scalars("grpo/loss")] == list(range(1, int(grpo_steps) + 1))
    assert [e.step for e in board.Scalars("oel/kl")] == [svc.trainer.policy.steps]
    assert {"grpo/reward", "grpo/clip_ratio", "grpo/completions/mean_length", "oel/round/kl"} <= set(board.Tags()["scalars"])

    # tenant isolation: other tenants' records and knowledge never reached training
    assert svc.buffer.skipped["other_tenant"] == 4
    assert svc.buffer.skipped["quarantined"] == 1 and svc.buffer.skipped["no_signal"] == 1
    assert svc.trainer.knowledge.skipped_other_tenant == 1
    assert all("globex" not in str(p["messages"]) for p in svc.prompts)
    ckpt = svc.store.latest()
    assert ckpt is not None and ckpt.state["consolidated_knowledge"] == {"acme/support": 1}

    # two versions in the store, for acme, chained base -> v1 -> v2, with offsets and metrics
    versions = {m.version: m for m in stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions
                if m.version != "base"}
    assert sorted(versions) == ["v1", "v2"]
    v1, v2 = versions["v1"], versions["v2"]
    assert (v1.algorithm, v1.parent_version, v1.tenant, v1.kind) == ("grpo", "base", "acme", "lora")
    assert (v2.algorithm, v2.parent_version, v2.tenant) == ("oel", "v1", "acme")
    assert {f.path for f in v1.files} >= {"adapter_model.safetensors", "adapter_config.json"}
    assert v1.data_offsets and all(o.topic == topics.graded and o.end_offset > o.start_offset for o in v1.data_offsets)
    assert sum(o.end_offset - o.start_offset for o in v1.data_offsets) == 18     # every graded record read
    assert v1.train_metrics["reward_std"] > 0 and "grad_norm" in v1.train_metrics
    assert "kl" in v2.train_metrics and v1.training_metadata["checkpoint_id"] != v2.training_metadata["checkpoint_id"]

    # the first round trained acme's usable rollouts only, complete groups included
    first = next(c for c in svc.store.dir.iterdir() if c.name.startswith("ckpt-000001"))
    trained = set(json.loads((first / "state.json").read_text())["trained_ids"])
    assert trained <= set(ids["acme"]) and {i for i in ids["acme"] if "-g" in i} <= trained

    # announced on the checkpoints topic, keyed by model, same versions and tenant
    recs = read_all(kafka_bootstrap, topics.checkpoints, expect=2, timeout=20)
    events = [decode(events_pb2.CheckpointPublished, m.value()) for m in recs]
    assert [(e.version, e.parent_version, e.tenant, e.algorithm) for e in events] == [
        ("v1", "base", "acme", "grpo"), ("v2", "v1", "acme", "oel")]
    assert all(m.key() == MODEL.encode() for m in recs) and events[0].manifest_sha256
    # signed as the trainer: the weights service's gate accepts them (shared/kafka/trust.py)
    trust = RecordTrust.from_settings(CommonSettings())
    assert [trust.verdict(m.topic() or "", m.key(), m.value(), m.headers()).principal for m in recs] == ["trainer"] * 2

    # the poison record went to the dead-letter topic, tagged with the stage
    dead = [decode(events_pb2.DeadLetter, m.value()) for m in read_all(kafka_bootstrap, topics.deadletter, expect=1)]
    assert [(d.stage, d.origin_topic) for d in dead] == [("trainer.graded.decode", topics.graded)]


def test_weights_unavailable_blocks_rounds_until_published(topics: Topics, kafka_bootstrap: str, tmp_path: Path,
                                                           tiny_model_name: str) -> None:
    """A round whose version cannot be uploaded stays on disk; no further round runs until it is published
    (versions chain parent -> child); once the store answers, the same checkpoint is uploaded."""
    import socket

    from services.weights.service import start as start_weights
    from services.weights.settings import LocalStoreSettings, WeightsSettings
    from shared.models import load_tokenizer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
    stub = weights_pb2_grpc.WeightsStub(channel)
    tok = load_tokenizer(tiny_model_name)
    produce_traffic(kafka_bootstrap, topics, tok, n_groups=2, singles=0)
    settings = TrainerSettings(
        common=CommonSettings(model=MODEL), tenant="acme", state_dir=tmp_path / "trainer", metrics_port=0,
        trigger_samples=8, batch_size=8, distill_enabled=False, publish_retry_s=0.0)
    svc = TrainerService(settings, stub)
    running = None
    try:
        deadline = time.monotonic() + 60
        while svc.unpublished is None and time.monotonic() < deadline:
            svc.poll(timeout=0.5)
            svc.maybe_train()
        first = svc.unpublished
        assert first is not None and svc.store.published() == {}
        produce_traffic(kafka_bootstrap, topics, tok, n_groups=2, singles=0, seed=1, tag="b")
        for _ in range(6):
            svc.poll(timeout=0.5)
            assert svc.maybe_train() is None and svc.unpublished is first   # blocked: the new groups wait
        assert len(svc.buffer.ready(time.time())) == 8
        running = start_weights(WeightsSettings(port=port, host="127.0.0.1", metrics_port=0,
                                                store=LocalStoreSettings(dir=tmp_path / "store"), policy="manual"), consume=False)
        assert running.port == port
        deadline = time.monotonic() + 60
        results: list[RoundResult] = []
        while len(results) < 1 and time.monotonic() < deadline:
            svc.poll(timeout=0.2)
            r = svc.maybe_train()
            if r is not None:
                results.append(r)
        assert svc.store.published()[first.id]["version"] == "v1"
        assert results and results[0].algorithm == "grpo"
        versions = {m.version: m for m in stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions}
        assert versions["v2"].parent_version == "v1"
    finally:
        svc.close()
        channel.close()
        if running is not None:
            running.stop(grace=1.0)
