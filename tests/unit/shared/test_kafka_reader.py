"""shared/kafka/reader.py against a hand-made consumer (the careful cases, without a broker), and
shared/kafka/consumers.py's configuration.

The hand-made consumer holds a log per partition in which some offsets are never delivered (transaction
markers, aborted records): as librdkafka does, its position moves past them once the fetch reaches them.
tests/integration/test_kafka_reader.py checks the same cases against the real broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, TopicPartition

from shared.kafka.consumers import consumer_config, private_group
from shared.kafka.reader import ReadTimeout, TopicMissing, read_to_end
from shared.kafka.security import KafkaSecurity

TOPIC = "t"


class Rec:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class Meta:
    def __init__(self, partitions: list[int]) -> None:
        self.error = None
        self.partitions = dict.fromkeys(partitions)


class FakeConsumer:
    """`logs`: partition -> (low, high, offsets that are delivered); `grow`: records appended after the
    watermarks were read (delivered if fetched); `stall`: partitions whose fetch never progresses."""

    def __init__(self, logs: Mapping[int, tuple[int, int, list[int]]], *, grow: Mapping[int, int] | None = None,
                 stall: frozenset[int] = frozenset(), exists: bool = True) -> None:
        self.logs, self.grow, self.stall, self.exists = dict(logs), dict(grow or {}), stall, exists
        self.pos: dict[int, int] = {}
        self.sought: list[tuple[int, int]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        class Md:
            topics = {TOPIC: Meta(sorted(self.logs))} if self.exists else {}
        return Md()

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        low, high, _ = self.logs[tp.partition]
        return low, high

    def assign(self, tps: list[TopicPartition]) -> None:
        self.pos = {tp.partition: tp.offset for tp in tps}
        self.fetched: set[int] = set()

    def consume(self, n: int, timeout: float) -> list[Rec]:
        out: list[Rec] = []
        for p, at in self.pos.items():
            if p in self.stall:
                continue
            low, high, delivered = self.logs[p]
            last = high + self.grow.get(p, 0)
            while at < last and len(out) < n:
                if at in delivered or at >= high:
                    out.append(Rec(p, at))
                at += 1                                # markers and aborted records: skipped, position moves on
            self.pos[p] = at
            self.fetched.add(p)
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, tp.partition, self.pos[tp.partition] if tp.partition in self.fetched
                               else OFFSET_INVALID) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        self.sought.append((tp.partition, tp.offset))


def read(fake: FakeConsumer, **kw: Any) -> list[tuple[int, int]]:
    return [(int(m.partition() or 0), int(m.offset() or 0)) for m in read_to_end(cast(Consumer, fake), TOPIC, **kw)]


def test_empty_partitions_are_done_without_a_poll() -> None:
    fake = FakeConsumer({0: (0, 0, []), 1: (5, 5, [])}, stall=frozenset({0, 1}))
    assert read(fake, timeout_s=0.5) == []


def test_markers_and_aborted_records_at_the_end_do_not_hold_the_read() -> None:
    # partition 0: records 0-2 committed, 3 commit marker, 4-5 aborted, 6 abort marker; end 7
    fake = FakeConsumer({0: (0, 7, [0, 1, 2]), 1: (0, 2, [0, 1])})
    assert read(fake, timeout_s=2) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_records_written_during_the_read_are_left_for_whoever_follows() -> None:
    fake = FakeConsumer({0: (0, 3, [0, 1, 2])}, grow={0: 2})
    assert read(fake, timeout_s=2) == [(0, 0), (0, 1), (0, 2)]
    assert fake.sought == [(0, 3)]


def test_start_offsets_per_partition_and_retention() -> None:
    fake = FakeConsumer({0: (0, 4, [0, 1, 2, 3]), 1: (2, 4, [2, 3]), 2: (0, 2, [0, 1])})
    assert read(fake, start={0: 3, 1: 0}, timeout_s=2) == [(0, 3), (1, 2), (1, 3), (2, 0), (2, 1)]
    assert read(fake, partitions=[2], start=OFFSET_BEGINNING, timeout_s=2) == [(2, 0), (2, 1)]


def test_a_read_that_cannot_finish_says_where_it_stopped() -> None:
    fake = FakeConsumer({0: (0, 2, [0, 1]), 1: (0, 3, [0, 1, 2])}, stall=frozenset({1}))
    with pytest.raises(ReadTimeout, match=r"\[1\] at no fetch yet of 3") as e:
        read(fake, timeout_s=0.3)
    assert e.value.left == {1: (OFFSET_INVALID, 3)}


def test_a_missing_topic_is_named() -> None:
    with pytest.raises(TopicMissing, match="'t'"):
        read(FakeConsumer({0: (0, 0, [])}, exists=False))


def test_a_topic_the_broker_learns_of_a_moment_later_is_read() -> None:
    class Late(FakeConsumer):
        asked = 0

        def list_topics(self, topic: str, timeout: float) -> Any:
            self.asked += 1
            self.exists = self.asked > 2          # unknown twice, as right after create_topics
            return super().list_topics(topic, timeout)

    fake = Late({0: (0, 1, [0])})
    assert read(fake, timeout_s=5) == [(0, 0)]
    assert fake.asked == 3


def test_every_consumer_commits_nothing_by_itself_and_reads_committed() -> None:
    c = consumer_config("b:9092", purpose="trainer-graded", security=KafkaSecurity())
    assert c["bootstrap.servers"] == "b:9092"
    assert c["client.id"] == "apprentice-trainer-graded"
    assert c["group.id"].startswith("trainer-graded-") and c["group.id"] != private_group("trainer-graded")
    assert (c["enable.auto.commit"], c["enable.auto.offset.store"]) == (False, False)
    assert c["isolation.level"] == "read_committed"
    assert callable(c["error_cb"]) and hasattr(c["logger"], "log")
    assert "log_level" not in c and "max.poll.interval.ms" not in c


def test_the_consumer_takes_its_security_from_the_settings(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    sec = KafkaSecurity(protocol="SASL_SSL", username="u", password="p", ssl_ca=ca)
    c = consumer_config("b:9093", purpose="x", group_id="g", security=sec, log_level=3, max_poll_interval_ms=60_000)
    assert (c["security.protocol"], c["sasl.username"], c["sasl.password"]) == ("sasl_ssl", "u", "p")
    assert c["ssl.ca.location"] == str(ca)
    assert (c["group.id"], c["log_level"], c["max.poll.interval.ms"]) == ("g", 3, 60_000)
