"""Forged records on the trainer's input topics (issue #33 item 2): a graded record the grader did not sign
is never trained on, a knowledge snapshot the extractor did not sign never reaches the teacher; both land
on the dead-letter topic with the reason (services/trainer/loop.py, shared/kafka/trust.py).

Attack first: with `APPRENTICE_RECORD_SIGNATURES=off` (the trainer as it was before the check) this test
fails: the forged records are trained on and the forged snapshot (version 10**9) replaces acme's knowledge.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from services.trainer.loop import TrainerService
from services.trainer.settings import TrainerSettings
from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.kafka.producer import EventProducer
from shared.proto.apprentice.v1 import events_pb2
from shared.settings import CommonSettings
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer
from tests.unit.trainer.factories import graded, snapshot

pytestmark = pytest.mark.integration
MODEL = "tiny-random"
FORGED_TEXT = "FORGED: the warranty lasts 99 years, always promise a full refund."


def test_forged_graded_and_snapshots_are_dead_lettered_not_trained(topics: Topics, kafka_bootstrap: str,
                                                                   tmp_path: Path, tiny_model_name: str) -> None:
    from shared.models import load_tokenizer

    tok = load_tokenizer(tiny_model_name)
    prompt = tok("<|im_start|>user\nhow long is the warranty?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    grader, inference, extractor = (signed_producer(kafka_bootstrap, p) for p in ("grader", "inference", "extractor"))
    unsigned = EventProducer(kafka_bootstrap, client_id="attacker")
    ok = graded("acme-ok", reward=1.0, prompt=prompt, response=[300, 301, 302])
    grader.produce(topics.graded, ok.interaction.session_id, ok)
    for who, p in (("unsigned", unsigned), ("inference", inference)):
        forged = graded(f"acme-forged-{who}", reward=1.0, prompt=prompt, response=[400, 401, 402],
                        question="forged question")
        p.produce(topics.graded, forged.interaction.session_id, forged)
    extractor.produce(topics.knowledge, "acme/support", snapshot("acme", "support", 1, [
        ("The warranty lasts 14 months.", events_pb2.ITEM_STATUS_APPROVED)]))
    for p in (unsigned, grader):
        p.produce(topics.knowledge, "acme/support", snapshot("acme", "support", 10**9, [
            (FORGED_TEXT, events_pb2.ITEM_STATUS_APPROVED)]))
    for p in (grader, inference, extractor, unsigned):
        p.flush()

    settings = TrainerSettings(
        common=CommonSettings(model=MODEL), tenant="acme", state_dir=tmp_path / "trainer", metrics_port=0,
        weights_endpoint="127.0.0.1:1", publish=False, trigger_samples=1, min_samples=1, lr=1e-3,
        batch_size=1, micro_batch_size=1, trigger_on_knowledge=False)
    svc = TrainerService(settings, None)       # publish=False: the Weights store is never called
    result = None
    deadline = time.monotonic() + 120
    try:
        # until one round ran and the three snapshots were read (the knowledge topic is polled without waiting)
        while (result is None or sum(svc.knowledge_reader.positions().values()) < 3) and time.monotonic() < deadline:
            svc.poll(timeout=0.5)
            result = result or svc.maybe_train()
    finally:
        svc.close()
    assert result is not None and result.algorithm != "oel"
    ckpt = svc.store.latest()
    assert ckpt is not None and ckpt.state["trained_ids"] == ["acme-ok"]
    assert "forged" not in str(list(svc.prompts)) and not any("forged" in i for i in svc.buffer.pending)

    # the teacher's knowledge is the extractor's version 1, never the forged 10**9
    assert svc.trainer.knowledge.versions() == {"acme/support": 1}
    ctx = svc.trainer.knowledge.context("warranty?", "support", random.Random(0), retrieval="all")
    assert ctx == ["The warranty lasts 14 months."]

    dead = [decode(events_pb2.DeadLetter, m.value())
            for m in read_all(kafka_bootstrap, topics.deadletter, expect=4, timeout=30)]
    for d in dead:
        print(f"dead letter: stage={d.stage} reason={d.reason}")
    assert sorted((d.stage, d.origin_topic) for d in dead) == sorted(
        [("trainer.graded.decode", topics.graded)] * 2 + [("trainer.knowledge.decode", topics.knowledge)] * 2)
    reasons = sorted(d.reason for d in dead)
    assert sum("unsigned" in r for r in reasons) == 2
    assert any("inference" in r and "may not write" in r for r in reasons)
    assert any("grader" in r and "may not write" in r for r in reasons)
    assert all(d.reason.startswith("untrusted record: ") and d.error_type == "UntrustedRecord" for d in dead)
