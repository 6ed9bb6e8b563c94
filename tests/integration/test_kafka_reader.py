"""shared/kafka/reader.py against the real broker: exactly the records up to the end taken at the start,
on an empty topic, on several partitions, and on a transactional topic whose last offsets are markers and
aborted records, with a transaction still open (the hand-made cases: tests/unit/shared/test_kafka_reader.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer
from confluent_kafka.admin import NewTopic

from shared.contracts.topics import Topics
from shared.kafka.admin import admin, delete_topics
from shared.kafka.consumers import Isolation, new_consumer
from shared.kafka.reader import Start, read_to_end, read_topic_to_end
from shared.kafka.security import librdkafka_config

pytestmark = pytest.mark.integration


@pytest.fixture
def make_topic(kafka_bootstrap: str, topics: Topics) -> Iterator[Callable[[int], str]]:
    made: list[str] = []

    def make(partitions: int) -> str:
        name = f"{topics.prefix}reader-{uuid.uuid4().hex[:6]}"
        client = admin(kafka_bootstrap)        # held until the futures resolve
        for fut in client.create_topics([NewTopic(name, partitions, 1)]).values():
            fut.result(30)
        made.append(name)
        return name

    yield make
    delete_topics(kafka_bootstrap, made)


def values(bootstrap: str, topic: str, *, partitions: list[int] | None = None, start: Start = OFFSET_BEGINNING,
           isolation: Isolation = "read_committed") -> list[tuple[int, bytes]]:
    return [(int(m.partition() or 0), m.value() or b"")
            for m in read_topic_to_end(bootstrap, topic, purpose="test-reader", partitions=partitions, start=start,
                                       isolation=isolation, timeout_s=20)]


def test_an_empty_topic_reads_as_nothing_at_once(kafka_bootstrap: str, make_topic: Callable[[int], str]) -> None:
    topic = make_topic(3)
    t0 = time.monotonic()
    assert values(kafka_bootstrap, topic) == []
    assert time.monotonic() - t0 < 5


def test_every_partition_is_read_to_its_end_and_no_further(kafka_bootstrap: str, make_topic: Callable[[int], str]) -> None:
    topic = make_topic(3)
    p = Producer({**librdkafka_config(), "bootstrap.servers": kafka_bootstrap})
    sent = [(i % 2, f"r{i}".encode()) for i in range(10)]          # partitions 0 and 1; 2 stays empty
    for part, v in sent:
        p.produce(topic, v, partition=part)
    assert p.flush(30) == 0
    assert sorted(values(kafka_bootstrap, topic)) == sorted(sent)
    assert values(kafka_bootstrap, topic, partitions=[1], start={1: 3}) == [s for s in sent if s[0] == 1][3:]

    # a reader that goes on following gets what was written after the end it read to
    c = new_consumer(kafka_bootstrap, purpose="test-reader")
    try:
        assert len(list(read_to_end(c, topic, timeout_s=20))) == 10
        p.produce(topic, b"later", partition=2)
        p.flush(30)
        later: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while not later and time.monotonic() < deadline:
            later = [m.value() for m in c.consume(10, 0.5) if m.error() is None]
        assert later == [b"later"]
    finally:
        c.close()


def test_a_transactional_topic_ends_past_its_markers_and_aborted_records(kafka_bootstrap: str,
                                                                         make_topic: Callable[[int], str]) -> None:
    topic = make_topic(3)
    p = Producer({**librdkafka_config(), "bootstrap.servers": kafka_bootstrap, "transactional.id": f"test-reader-{uuid.uuid4()}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"committed-{i}".encode(), partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, f"aborted-{i}".encode(), partition=0)
    p.flush(30)
    p.abort_transaction(30)                    # partition 0 now ends with aborted records and a marker
    p.begin_transaction()
    p.produce(topic, b"open", partition=1)     # still open while the topic is read
    p.flush(30)
    try:
        t0 = time.monotonic()
        assert values(kafka_bootstrap, topic) == [(0, f"committed-{i}".encode()) for i in range(3)]
        assert time.monotonic() - t0 < 10, "the markers or the open transaction held the read"
        # read_uncommitted sees the aborted and open records: its end is the high watermark
        assert len(values(kafka_bootstrap, topic, isolation="read_uncommitted")) == 6
    finally:
        p.abort_transaction(30)
