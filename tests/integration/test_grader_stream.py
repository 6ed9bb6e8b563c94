"""The grader against the real broker: one `python -m services.grader` process serves every test here.

Immediate grading, feedback joined within the window, late feedback -> revision, tool time-out ->
masked, duplicates idempotent, malformed records -> dead-letter topic while the app keeps running,
detector flags + quarantine + Prometheus metrics.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from services.grader.core.join import graded_event_id
from shared.contracts.topics import INTERACTIONS, Topics
from shared.contracts.validation import KafkaHeaders
from shared.kafka.admin import ensure_topics
from shared.kafka.security import librdkafka_config
from shared.kafka.signing import RecordSigner
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import (
    GraderProcess,
    by_interaction,
    delete_namespace,
    feedback,
    graded,
    grader_env,
    interaction,
)
from tests.helpers.kafka import TopicReader
from tests.helpers.ports import free_port
from tests.helpers.signing import signed_producer, signer
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
version: it-1
tasks:
  - tenant: demo
    task: support
    feedback_window_s: 4
    graders:
      - {name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}
      - {name: corrected, type: feedback, kind: correction, weight: 0}
  - tenant: demo
    task: rules
    graders:
      - {name: has_number, type: regex, pattern: "[0-9]+", success: true}
      - {name: mentions_warranty, type: contains, any_of: [warranty], ignore_case: true}
"""


class Stack:
    def __init__(self, bootstrap: str, topics: Topics, grader: GraderProcess, metrics_port: int) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.grader = grader
        self.metrics_port = metrics_port
        self.producer = signed_producer(bootstrap, "inference", client_id="grader-test")
        self.graded = TopicReader(bootstrap, topics.graded)

    def send_interaction(self, it: events_pb2.Interaction | bytes, key: str = "") -> None:
        if isinstance(it, events_pb2.Interaction):
            key = key or it.session_id
        self.producer.produce(self.topics.interactions, key, it)
        self.producer.flush()

    def send_feedback(self, fb: events_pb2.FeedbackEvent | bytes, key: str = "") -> None:
        if isinstance(fb, events_pb2.FeedbackEvent):
            key = key or fb.interaction_id
        self.producer.produce(self.topics.feedback, key, fb)
        self.producer.flush()

    def records_for(self, iid: str, n: int, timeout: float = 40.0) -> list[events_pb2.GradedInteraction]:
        recs = self.graded.wait_for(lambda rs: len(by_interaction(rs, iid)) >= n, timeout, parse=graded)
        out = by_interaction(recs, iid)
        assert len(out) >= n, f"expected {n} graded records for {iid}, got {len(out)}; grader log:\n" \
                              f"{self.grader.log_tail()}"
        return out


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_bootstrap, topics)
    home = tmp_path_factory.mktemp("grader")
    cfg = home / "grader.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    grader = GraderProcess(grader_env(topics.prefix, kafka_bootstrap, cfg, home, metrics_port=str(port)),
                           Path(home) / "grader.log").start()
    s = Stack(kafka_bootstrap, topics, grader, port)
    try:
        yield s
    finally:
        grader.stop()
        s.graded.close()
        delete_namespace(kafka_bootstrap, topics.prefix)


def test_immediate_rule_grading(stack: Stack) -> None:
    it = interaction(task="rules", text="Your warranty is 24 months.")
    stack.send_interaction(it)
    [rec] = stack.records_for(it.interaction_id, 1)
    assert (rec.revision, rec.reward, rec.has_signal, rec.success) == (1, 1.0, True, True)
    assert [(c.name, c.value, c.has_signal) for c in rec.components] == [("has_number", 1.0, True),
                                                                         ("mentions_warranty", 1.0, True)]
    assert rec.envelope.event_id == graded_event_id(it.interaction_id, 1)
    assert rec.grader_config_version == "it-1" and not rec.quarantined
    raw = next(m for m in stack.graded.records if graded(m.value()).interaction.interaction_id == it.interaction_id)
    assert raw.key() == it.session_id.encode()  # graded topic key = session id


def test_interactions_written_in_transactions_are_graded_and_committed_past(stack: Stack) -> None:
    """A producer outside Apprentice that writes the interactions topic in transactions leaves offsets
    that hold no record for a read_committed reader: commit and abort markers, an aborted transaction's
    records. The committed interactions are graded, the aborted ones never, and the grader's commit
    moves past those offsets (one that waited for them would hold the partition back for good)."""
    run = uuid.uuid4().hex[:8]
    producer = Producer({**librdkafka_config(), "bootstrap.servers": stack.bootstrap, "transactional.id": f"outside-{run}",
                         "enable.idempotence": True})
    producer.init_transactions(30)
    inference = signer("inference")
    kept = [interaction(task="rules", text=f"Warranty {i} months.", session_id=f"txn-{run}") for i in range(3)]
    dropped = [interaction(task="rules", text=f"Dropped {i}.", session_id=f"txn-{run}") for i in range(2)]
    for batch, commit in ((kept[:1], True), (dropped, False), (kept[1:], True)):
        producer.begin_transaction()
        for it in batch:
            value, key = it.SerializeToString(), it.session_id.encode()
            producer.produce(stack.topics.interactions, value, key, partition=0,  # signed as inference would
                             headers=_signed(inference, INTERACTIONS, key, value))
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # written to the log, then aborted (an abort before sending writes nothing)
            producer.abort_transaction(30)
    for it in kept:
        [rec] = stack.records_for(it.interaction_id, 1)
        assert rec.revision == 1 and rec.has_signal
    graded_ids = {graded(m.value()).interaction.interaction_id for m in stack.graded.records}
    assert not graded_ids & {it.interaction_id for it in dropped}  # same partition, written before kept[1:]

    reader = Consumer({**librdkafka_config(), "bootstrap.servers": stack.bootstrap, "group.id": f"{stack.topics.prefix}apprentice-grader",
                       "enable.auto.commit": False})
    try:
        tp = TopicPartition(stack.topics.interactions, 0)
        _low, end = reader.get_watermark_offsets(tp, timeout=10)
        # everything up to the last record (end - 1 is its commit marker)
        wait_for(lambda: reader.committed([tp], timeout=10)[0].offset >= end - 1,
                 what=f"the commit to reach the partition end {end}", stall_s=30, every=0.5,
                 detail=lambda: f"committed: {reader.committed([tp], timeout=10)[0].offset}")
    finally:
        reader.close()


def test_feedback_joined_within_window(stack: Stack) -> None:
    it = interaction()
    stack.send_interaction(it)
    stack.send_feedback(feedback(it.interaction_id, value=1.0))
    [rec] = stack.records_for(it.interaction_id, 1)
    assert (rec.revision, rec.reward, rec.has_signal, rec.success) == (1, 1.0, True, True)
    assert [f.kind for f in rec.feedback] == ["kpi"]


def test_late_feedback_produces_a_revision(stack: Stack) -> None:
    it = interaction()
    stack.send_interaction(it)
    [first] = stack.records_for(it.interaction_id, 1)  # window (4 s) expires without feedback
    assert (first.revision, first.has_signal, first.no_signal_reason) == (1, False, "window_expired")
    stack.send_feedback(feedback(it.interaction_id, value=0.0))
    recs = stack.records_for(it.interaction_id, 2)
    assert (recs[1].revision, recs[1].has_signal, recs[1].reward, recs[1].success) == (2, True, 0.0, False)
    stack.send_feedback(feedback(it.interaction_id, kind="correction", value=-1, comment="It is 24 months."))
    recs = stack.records_for(it.interaction_id, 3)
    assert [r.revision for r in recs] == [1, 2, 3]
    assert recs[2].reward == 0.0 and any(f.comment == "It is 24 months." for f in recs[2].feedback)
    assert len({r.envelope.event_id for r in recs}) == 3


def test_tool_timeout_is_masked_not_zero(stack: Stack) -> None:
    it = interaction(messages=[("user", "Where is my order?"), ("tool", "order-lookup: request timed out")],
                     text="Sorry, I could not check right now.")
    stack.send_interaction(it)
    [rec] = stack.records_for(it.interaction_id, 1)
    assert (rec.has_signal, rec.no_signal_reason, rec.reward) == (False, "tool_timeout", 0.0)
    assert "tool_timeout" in rec.flags


def test_duplicate_events_are_idempotent(stack: Stack) -> None:
    it = interaction()
    fb = feedback(it.interaction_id, value=1.0)
    for _ in range(3):
        stack.send_interaction(it)
        stack.send_feedback(fb)
    stack.send_interaction(it, key="another-session-key")  # same event id under another key
    recs = stack.records_for(it.interaction_id, 1)
    stack.graded.poll(6.0)  # longer than the window: an expiry must not add anything either
    recs = by_interaction([graded(m.value()) for m in stack.graded.records], it.interaction_id)
    assert len(recs) == 1
    assert (recs[0].revision, recs[0].reward, len(recs[0].feedback)) == (1, 1.0, 1)


def test_malformed_records_go_to_the_dead_letter_topic_and_the_app_keeps_running(stack: Stack) -> None:
    stack.send_interaction(b"\xff\x00 definitely not protobuf", key="bad-1")
    stack.send_feedback(events_pb2.FeedbackEvent(interaction_id="x").SerializeToString(), key="bad-2")
    dlq = TopicReader(stack.bootstrap, stack.topics.deadletter)
    try:
        letters = dlq.wait_for(lambda rs: len(rs) >= 2, 30, parse=events_pb2.DeadLetter.FromString)
    finally:
        dlq.close()
    by_key = {d.original_key: d for d in letters}
    assert by_key[b"bad-1"].stage == "grader.decode" and by_key[b"bad-1"].origin_topic == stack.topics.interactions
    assert by_key[b"bad-1"].original_value == b"\xff\x00 definitely not protobuf"
    assert "without envelope" in by_key[b"bad-2"].reason and by_key[b"bad-2"].origin_topic == stack.topics.feedback
    it = interaction(task="rules", text="7 days")
    stack.send_interaction(it)
    assert stack.records_for(it.interaction_id, 1)[0].has_signal
    assert stack.grader.alive()


def test_degenerate_output_is_flagged_quarantined_and_counted(stack: Stack) -> None:
    it = interaction(task="rules", text="warranty 24 " * 30)
    clean = interaction(task="rules", text="The warranty is 24 months from purchase.")
    stack.send_interaction(it)
    stack.send_interaction(clean)
    [rec] = stack.records_for(it.interaction_id, 1)
    [ok] = stack.records_for(clean.interaction_id, 1)
    assert "degenerate" in rec.flags and rec.quarantined and rec.has_signal
    assert not ok.flags and not ok.quarantined

    def flagged() -> str | None:
        t = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5).read().decode()
        return t if 'apprentice_grader_flags_total{flag="degenerate",task="rules",tenant="demo"}' in t else None

    text = wait_for(flagged, what="the degenerate flag counted", stall_s=10, every=0.5)
    assert 'apprentice_grader_flags_total{flag="degenerate",task="rules",tenant="demo"} 1.0' in text
    assert 'apprentice_grader_quarantined_total{task="rules",tenant="demo"}' in text
    assert "apprentice_grader_reward_length_corr" in text


def _signed(by: RecordSigner, *args: Any) -> KafkaHeaders:
    """`by`'s signing headers (shared/kafka/signing.py `RecordSigner.headers`), typed as producers take them."""
    return [*by.headers(*args)]
