"""The shared Kafka helpers against the real local broker (started by the project's own tooling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.contracts.events import decode, make_envelope
from shared.contracts.topics import Topics
from shared.kafka import DeadLetterPublisher, EventConsumer, EventProducer
from shared.kafka.decode import decode_batch
from shared.kafka.security import librdkafka_config
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _interaction(i: int, tenant: str = "acme") -> events_pb2.Interaction:
    return events_pb2.Interaction(envelope=make_envelope(tenant, source="test"), interaction_id=f"i{i}",
                                  session_id=f"s{i % 3}", response_text=f"answer {i}")


def test_produce_and_consume_through_shared_helpers(kafka_bootstrap: str, topics: Topics) -> None:
    producer = EventProducer(kafka_bootstrap, client_id="t")
    sent = [_interaction(i) for i in range(20)]
    for ev in sent:
        producer.produce(topics.interactions, ev.session_id, ev)
    producer.flush()
    assert producer.delivered == 20 and producer.failed == 0

    consumer = EventConsumer(kafka_bootstrap, "g-basic", [topics.interactions])
    got = []
    for _ in range(30):
        batch = consumer.poll_batch(timeout=1.0)
        got += [decode(events_pb2.Interaction, m.value()) for m in batch]
        consumer.commit(batch)
        if len(got) >= 20:
            break
    consumer.close()
    assert sorted(g.envelope.event_id for g in got) == sorted(e.envelope.event_id for e in sent)
    # same key --> same partition --> order kept per session
    for s in ("s0", "s1", "s2"):
        ids = [g.interaction_id for g in got if g.session_id == s]
        assert ids == sorted(ids, key=lambda x: int(x[1:]))


def test_garbage_bytes_become_a_dead_letter_and_the_consumer_goes_on(kafka_bootstrap: str, topics: Topics) -> None:
    producer = EventProducer(kafka_bootstrap)
    producer.produce(topics.interactions, "s", _interaction(1))
    producer.produce(topics.interactions, "s", b"\x08\x96\x01garbage\xff\xff")
    producer.produce(topics.interactions, "s", _interaction(2))
    producer.flush()
    dlp = DeadLetterPublisher(producer, topics.deadletter, source="test")
    consumer = EventConsumer(kafka_bootstrap, "g-dl", [topics.interactions])
    good = []
    for _ in range(20):
        batch = consumer.poll_batch(timeout=1.0)
        good += decode_batch(batch, events_pb2.Interaction, dlp, stage="test.decode")
        consumer.commit(batch)
        if len(good) >= 2:
            break
    consumer.close()
    assert [ev.interaction_id for _, ev in good] == ["i1", "i2"]
    dead = read_all(kafka_bootstrap, topics.deadletter, expect=1)
    assert len(dead) == 1
    dl = decode(events_pb2.DeadLetter, dead[0].value())
    assert dl.stage == "test.decode" and "not a apprentice.v1.Interaction" in dl.reason
    assert (dl.origin_topic, dl.origin_offset) == (topics.interactions, 1)
    assert dl.original_value.endswith(b"\xff\xff")


def test_apprentice_tail_prints_a_produced_event_as_json(kafka_bootstrap: str, topics: Topics) -> None:
    # as inference writes it (signed), then the same value unsigned: tail names the signer, or the refusal
    producer = signed_producer(kafka_bootstrap, "inference")
    ev = _interaction(42)
    producer.produce(topics.interactions, ev.session_id, ev)
    producer.flush()
    unsigned = EventProducer(kafka_bootstrap)
    unsigned.produce(topics.interactions, ev.session_id, ev)
    unsigned.flush()
    env = dict(os.environ, APPRENTICE_TOPIC_PREFIX=topics.prefix, APPRENTICE_KAFKA_BOOTSTRAP=kafka_bootstrap)
    out = subprocess.run([sys.executable, "-m", "tools.cli.main", "tail", "interactions", "--from-beginning",
                          "--max", "2", "--timeout", "30"], capture_output=True, text=True, env=env, timeout=90,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    record, copy = (json.loads(line) for line in out.stdout.strip().splitlines()[:2])
    assert record["topic"] == topics.interactions and record["key"] == ev.session_id
    assert record["value"]["interaction_id"] == "i42"
    assert record["value"]["envelope"]["event_id"] == ev.envelope.event_id
    assert record["signature"] == {"signer": "inference"}
    assert copy["signature"] == {"refused": "unsigned"}


def test_apprentice_tail_prints_a_json_topic_as_its_documents(kafka_bootstrap: str, topics: Topics) -> None:
    """The grading-rules topic holds JSON, not protobuf events: `tail` prints the document (and an error
    line for a value that is not JSON) instead of failing on a missing message type."""
    from confluent_kafka import Producer

    producer = Producer({**librdkafka_config(), "bootstrap.servers": kafka_bootstrap})
    producer.produce(topics.grader_rules, b'{"tenant": "acme", "task": "billing"}', key=b"acme/billing")
    producer.produce(topics.grader_rules, b"\xff not json", key=b"junk/x")
    producer.flush(30)
    env = dict(os.environ, APPRENTICE_TOPIC_PREFIX=topics.prefix, APPRENTICE_KAFKA_BOOTSTRAP=kafka_bootstrap)
    out = subprocess.run([sys.executable, "-m", "tools.cli.main", "tail", "grader-rules", "--from-beginning",
                          "--max", "2", "--timeout", "30"], capture_output=True, text=True, env=env, timeout=90,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = (json.loads(line) for line in out.stdout.strip().splitlines())
    assert first["key"] == "acme/billing" and first["value"] == {"tenant": "acme", "task": "billing"}
    assert second["key"] == "junk/x" and "not a JSON document" in second["error"]


def test_broker_start_twice_is_harmless_and_status_reports_it(kafka_bootstrap: str) -> None:
    env = dict(os.environ, APPRENTICE_KAFKA_BOOTSTRAP=kafka_bootstrap)
    cli = [sys.executable, "-m", "tools.cli.main", "kafka"]
    for _ in range(2):
        out = subprocess.run([*cli, "start"], capture_output=True, text=True, env=env, timeout=180, cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "reused (already running)" in out.stdout or "started" in out.stdout
    status = subprocess.run([*cli, "status"], capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
    assert status.returncode == 0 and "kafka broker up at" in status.stdout


def test_topics_have_their_partitions_and_compaction(kafka_bootstrap: str, topics: Topics) -> None:
    from confluent_kafka.admin import ConfigResource

    from shared.kafka.admin import admin, list_topics

    parts = list_topics(kafka_bootstrap)
    for spec in topics.specs():
        assert parts[spec.name] == spec.partitions
    res = ConfigResource(ConfigResource.Type.TOPIC, topics.knowledge)
    client = admin(kafka_bootstrap)  # keep a reference: the futures die with the client
    cfg = client.describe_configs([res])[res].result(30)
    assert cfg["cleanup.policy"].value == "compact"
