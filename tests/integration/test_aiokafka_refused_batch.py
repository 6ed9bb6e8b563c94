"""services/grader/stream/patches.py, P2, against the real broker: after the broker refuses one batch of an
idempotent aiokafka producer (a record over the topic's `max.message.bytes`), the producer's later
records to that partition are still written, once each, in order.

Without P2 aiokafka keeps the refused batch's sequence numbers, and every later batch to the partition
fails with OutOfOrderSequenceNumber: the first test pins that this is still aiokafka's behaviour (so a
release that fixes it fails here and the patch can go), the second that the patch repairs it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError, OutOfOrderSequenceNumber
from aiokafka.producer import sender as aiokafka_sender
from confluent_kafka.admin import NewTopic

from services.grader.stream import patches as faust_patches
from shared.kafka.admin import admin, delete_topics
from shared.kafka.security import resolve
from tests.helpers.kafka import TopicReader

LIMIT = 20_000
"""The topic's `max.message.bytes`: the refused record is random bytes (incompressible) over it."""


@pytest.fixture
def small_topic(kafka_bootstrap: str) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:10]}.refused-batch"
    client = admin(kafka_bootstrap)  # held: the futures fail if the client is collected first
    futures = client.create_topics(
        [NewTopic(name, num_partitions=1, replication_factor=1, config={"max.message.bytes": str(LIMIT)})])
    futures[name].result(30)
    yield name
    delete_topics(kafka_bootstrap, [name])


async def _send_around_a_refused_record(bootstrap: str, topic: str) -> list[BaseException | None]:
    """good-1, then a record the broker refuses, then good-2 and good-3: each send's outcome."""
    sec = resolve()                     # the environment's client security, as every Kafka client takes it
    auth = {"sasl_mechanism": sec.mechanism, "sasl_plain_username": sec.username,
            "sasl_plain_password": sec.password} if sec.sasl else {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                                max_request_size=10 * LIMIT, security_protocol=sec.protocol, **auth)
    await producer.start()
    outcomes: list[BaseException | None] = []
    try:
        for value in (b"good-1", os.urandom(2 * LIMIT), b"good-2", b"good-3"):
            try:
                await asyncio.wait_for(await producer.send(topic, value, partition=0), 60)
                outcomes.append(None)
            except (MessageSizeTooLargeError, OutOfOrderSequenceNumber) as e:
                outcomes.append(e)
    finally:
        await producer.stop()
    return outcomes


def _values(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    reader = TopicReader(bootstrap, topic, isolation="read_uncommitted")
    try:
        reader.wait_for(lambda rs: len(rs) >= expected, timeout=30)
        reader.poll(1.0)  # and nothing more
        return [m.value() for m in reader.records]
    finally:
        reader.close()


def test_unpatched_aiokafka_fails_every_later_batch_after_a_refused_one(
        kafka_bootstrap: str, small_topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    unpatched = faust_patches.SequenceRewindingHandler.__mro__[1]
    assert unpatched.__name__ == "SendProduceReqHandler" and hasattr(unpatched, "handle_response")
    monkeypatch.setattr(aiokafka_sender, "SendProduceReqHandler", unpatched)
    outcomes = asyncio.run(_send_around_a_refused_record(kafka_bootstrap, small_topic))
    assert outcomes[0] is None
    assert isinstance(outcomes[1], MessageSizeTooLargeError)
    assert all(isinstance(o, OutOfOrderSequenceNumber) for o in outcomes[2:]), outcomes
    assert _values(kafka_bootstrap, small_topic, 1) == [b"good-1"]


def test_p2_a_refused_batch_gives_its_sequence_back_and_later_records_are_written_once(
        kafka_bootstrap: str, small_topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka_sender, "SendProduceReqHandler", faust_patches.SequenceRewindingHandler)
    outcomes = asyncio.run(_send_around_a_refused_record(kafka_bootstrap, small_topic))
    assert outcomes[0] is None and outcomes[2:] == [None, None], outcomes
    assert isinstance(outcomes[1], MessageSizeTooLargeError)
    assert _values(kafka_bootstrap, small_topic, 3) == [b"good-1", b"good-2", b"good-3"]
