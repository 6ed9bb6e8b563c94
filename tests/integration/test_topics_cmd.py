"""`apprentice topics`: creates the contract topics with their layout, at the replication asked for."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import ConfigResource

from shared.contracts.topics import Topics
from shared.kafka.admin import admin, delete_topics
from tools.broker.cli import topics


@pytest.fixture
def prefix(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    p = f"test-{uuid.uuid4().hex[:10]}."
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", p)
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    yield p
    delete_topics(kafka_bootstrap, [s.name for s in Topics(p).specs()])


def test_creates_every_topic_with_its_partitions_and_compaction(kafka_bootstrap: str, prefix: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert topics(["--replication", "1"]) == 0
    specs = Topics(prefix).specs()
    out = capsys.readouterr().out.splitlines()
    assert {line.removeprefix("created ") for line in out if line.startswith("created ")} == {s.name for s in specs}
    client = admin(kafka_bootstrap)
    md = client.list_topics(timeout=10).topics
    for s in specs:
        assert len(md[s.name].partitions) == s.partitions, s.name
        assert all(len(p.replicas) == 1 for p in md[s.name].partitions.values())
    compacted = [s for s in specs if s.compacted]
    assert compacted
    for spec in compacted:
        config = client.describe_configs([ConfigResource("topic", spec.name)])
        values = next(iter(config.values())).result(10)
        assert values["cleanup.policy"].value == "compact", spec.name


def test_more_replicas_than_brokers_is_a_one_line_error(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert topics(["--replication", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("apprentice topics: cannot create the topics:"), err
    assert "replication" in err[0].lower()
    with pytest.raises(SystemExit) as e:
        topics(["--replication", "0"])
    assert e.value.code == 2
