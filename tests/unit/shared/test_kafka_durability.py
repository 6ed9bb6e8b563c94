"""shared/kafka/durability.py without a broker: which producer settings are refused, which replication new
topics get, and that no Apprentice code builds a producer around the check (the cluster checks:
tests/integration/test_kafka_cluster.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.kafka.durability import (
    UnsafeKafkaConfig,
    cluster_replication,
    durable_producer,
    producer_problems,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("config", "problem"), [
    ({"acks": "1", "enable.idempotence": True}, "acks=1: set acks=all"),
    ({"acks": 0, "enable.idempotence": True}, "acks=0: set acks=all"),
    ({"request.required.acks": "1", "enable.idempotence": True}, "acks=1"),
    ({"acks": "all", "enable.idempotence": False}, "set enable.idempotence=true"),
    ({"acks": "all"}, "enable.idempotence is off"),
])
def test_weakened_producers_are_named(config: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in producer_problems(config))


def test_durable_producer_adds_what_is_missing_and_refuses_what_weakens() -> None:
    assert producer_problems({"acks": "all", "enable.idempotence": True}) == []
    assert producer_problems({"acks": -1, "enable.idempotence": "true"}) == []
    durable_producer({"bootstrap.servers": "127.0.0.1:1"}).flush(0)      # defaults added: accepted
    with pytest.raises(UnsafeKafkaConfig, match="acks=1: set acks=all"):
        durable_producer({"bootstrap.servers": "127.0.0.1:1", "acks": 1})


def test_new_topics_are_replicated_from_three_brokers_on() -> None:
    assert cluster_replication(1) == (1, 1)
    assert cluster_replication(2) == (1, 1)
    assert cluster_replication(3) == (3, 2)
    assert cluster_replication(5) == (3, 2)


def test_no_code_builds_a_raw_producer_but_the_durable_one() -> None:
    raw = re.compile(r"(?<![A-Za-z_.])Producer\(")
    offenders = [f"{p.relative_to(REPO)}:{i}" for d in ("services", "shared", "tools")
                 for p in sorted((REPO / d).rglob("*.py")) if "/proto/" not in str(p)
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if raw.search(line) and p.name != "durability.py"]
    assert offenders == [], "build producers with shared/kafka/durability.py's durable_producer: " + ", ".join(offenders)
