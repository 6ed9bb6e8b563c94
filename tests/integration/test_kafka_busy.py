"""shared/kafka/busy.py on the real broker: slow work runs while the consumer polls paused; nothing fetched
meanwhile is lost, errors reach the caller, a stop abandons the wait, and partitions are resumed after."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Message
from prometheus_client import REGISTRY

from shared.contracts.topics import Topics
from shared.kafka import EventConsumer, EventProducer
from shared.kafka.busy import WorkAbandoned
from shared.proto.apprentice.v1 import events_pb2

pytestmark = pytest.mark.integration


def _assigned(c: EventConsumer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not c.assignment() and time.monotonic() < deadline:
        c.poll_batch(10, 0.2)
    assert c.assignment()


def _produce(bootstrap: str, topic: str, n: int, start: int = 0) -> None:
    p = EventProducer(bootstrap, client_id="busy-test")
    for i in range(start, start + n):
        p.produce(topic, f"k{i}", events_pb2.DeadLetter(reason=f"r{i}"))
    p.flush()


def test_records_arriving_during_the_work_wait_and_are_then_read(topics: Topics, kafka_bootstrap: str) -> None:
    c = EventConsumer(kafka_bootstrap, topics.group_id("busy"), [topics.deadletter])
    try:
        _assigned(c)
        group = topics.group_id("busy")

        def work() -> str:
            _produce(kafka_bootstrap, topics.deadletter, 5)        # arrive while every partition is paused
            threading.Event().wait(1.5)                             # the slow dependency answers late
            return "done"

        assert c.call_while_polling(work) == "done"
        assert (REGISTRY.get_sample_value("apprentice_kafka_paused_polls_total", {"group": group}) or 0) >= 3
        # paused partitions fetched nothing (no record had to be put back)
        assert not REGISTRY.get_sample_value("apprentice_kafka_put_back_records_total", {"group": group})
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:       # resumed: the 5 records come now
            got += [events_pb2.DeadLetter.FromString(m.value()).reason for m in c.poll_batch(50, 0.5)]
        assert sorted(got) == [f"r{i}" for i in range(5)]
        assert c.rebalances == {"assigned": 1, "revoked": 0, "lost": 0}
    finally:
        c.close()


def test_an_error_reaches_the_caller_and_a_stop_abandons_the_wait(topics: Topics, kafka_bootstrap: str) -> None:
    c = EventConsumer(kafka_bootstrap, topics.group_id("busy-errors"), [topics.deadletter])
    try:
        _assigned(c)

        def fails() -> None:
            raise RuntimeError("dependency said no")

        with pytest.raises(RuntimeError, match="dependency said no"):
            c.call_while_polling(fails)
        stop = threading.Event()
        release = threading.Event()
        threading.Timer(0.5, stop.set).start()
        with pytest.raises(WorkAbandoned):
            c.call_while_polling(lambda: release.wait(30), stop=stop)
        release.set()
        _produce(kafka_bootstrap, topics.deadletter, 2)              # partitions were resumed both times
        got: list[Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += c.poll_batch(50, 0.5)
        assert len(got) == 2
    finally:
        c.close()
