"""A real three-broker KRaft cluster from the project's own tooling (tools/broker/cluster.py): topics created
with replication factor 3 and min.insync.replicas 2, unsafe topics named at start, and acknowledged records
kept exactly once through a broker killed with SIGKILL (the leader of the most partitions) and through a
rolling restart of all three, while a producer keeps sending."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.kafka.durability import (
    UnsafeKafkaConfig,
    durable_producer,
    require_durable_topics,
    topic_configs,
    topic_problems,
)
from shared.kafka.security import librdkafka_config
from tests.helpers.kafka import private_cluster
from tools.broker.cluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = private_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start(timeout=240)
        yield c
    finally:
        c.stop()


def _metadata(client: AdminClient, names: list[str], timeout: float = 30.0) -> ClusterMetadata:
    """The cluster's metadata once every one of `names` shows with its partitions (a broker that has not caught
    up with a topic created a moment ago does not list it yet)."""
    deadline = time.monotonic() + timeout
    while True:
        md = client.list_topics(timeout=10)
        if all(n in md.topics and md.topics[n].partitions for n in names) or time.monotonic() > deadline:
            return md
        time.sleep(0.2)


def _producer(c: LocalCluster) -> object:
    return durable_producer({**librdkafka_config(c.security(access.ADMIN)), "bootstrap.servers": c.bootstrap,
                             "linger.ms": 5, "message.timeout.ms": 60000, "log_level": 2})


def _read_all(c: LocalCluster, topic: str, expect: int, timeout: float = 90.0) -> list[bytes]:
    consumer = Consumer({**librdkafka_config(c.security(access.ADMIN)), "bootstrap.servers": c.bootstrap,
                         "group.id": f"check-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 2})
    consumer.subscribe([topic])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                out.append(m.value() or b"")
        end = time.monotonic() + 3           # anything beyond `expect` would be a duplicate: look for it
        while time.monotonic() < end:
            m = consumer.poll(0.3)
            if m is not None and not m.error():
                out.append(m.value() or b"")
    finally:
        consumer.close()
    return out


class Sender:
    """Sends numbered records until stopped; keeps the numbers the cluster acknowledged."""

    def __init__(self, c: LocalCluster, topic: str) -> None:
        self.p, self.topic = _producer(c), topic
        self.acked: set[int] = set()
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _done(self, err: KafkaError | None, m: Message) -> None:
        if err is None:
            self.acked.add(int(m.value() or b"-1"))
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.p.produce(self.topic, str(i).encode(), key=str(i % 7).encode(), on_delivery=self._done)  # type: ignore[attr-defined]
            self.p.poll(0)  # type: ignore[attr-defined]
            i += 1
            time.sleep(0.01)

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.p.flush(120)  # type: ignore[attr-defined]


def test_topics_are_replicated_three_times_with_two_in_sync(cluster: LocalCluster) -> None:
    topics = Topics(prefix=f"t-{uuid.uuid4().hex[:6]}.")
    su = cluster.security(access.ADMIN)
    assert ensure_topics(cluster.bootstrap, topics, security=su)
    client = cluster.admin_client()
    names = [s.name for s in topics.specs()]
    md = _metadata(client, names)
    assert len(md.brokers) == 3
    for name in names:
        assert {len(p.replicas) for p in md.topics[name].partitions.values()} == {3}, name
    # asked again while a broker that has not caught up with the new topics answers that it does not know them
    assert {c["min.insync.replicas"].value for c in topic_configs(client, names, 10).values()} == {"2"}
    assert topic_problems(client, names) == []
    # an offsets/transactions topic of the broker itself is replicated too
    internal = md.topics.get("__consumer_offsets")
    assert internal is None or {len(p.replicas) for p in internal.partitions.values()} == {3}


def test_a_topic_with_one_replica_is_refused_with_the_fix(cluster: LocalCluster) -> None:
    name = f"weak-{uuid.uuid4().hex[:6]}"
    client = cluster.admin_client()
    for fut in client.create_topics([NewTopic(name, 2, 1)]).values():
        fut.result(30)
    _metadata(client, [name])
    # the check reads the metadata again, maybe from a broker that has not caught up with the new topic (or
    # while one broker's registration lapses on a loaded machine: seen once in a CI run); wait until a read
    # shows it, then the check must refuse it
    deadline = time.monotonic() + 30
    while not topic_problems(client, [name]) and time.monotonic() < deadline:
        time.sleep(0.5)
    with pytest.raises(UnsafeKafkaConfig, match=rf"'{name}' has replication factor 1 .* 3-broker cluster.*apprentice topics"):
        require_durable_topics(client, [name])


def test_nothing_acknowledged_is_lost_or_doubled_through_a_killed_leader_and_a_rolling_restart(
        cluster: LocalCluster) -> None:
    topic = f"durable-{uuid.uuid4().hex[:6]}"
    ensure_topics(cluster.bootstrap, Topics(prefix=f"d-{uuid.uuid4().hex[:6]}."), security=cluster.security())
    client = cluster.admin_client()
    for fut in client.create_topics([NewTopic(topic, 6, 3, config={"min.insync.replicas": "2"})]).values():
        fut.result(30)
    _metadata(client, [topic])
    with Sender(cluster, topic) as s:
        time.sleep(3)
        leaders = list(cluster.leaders(topic).values())
        victim = max(set(leaders), key=leaders.count)        # the node that leads the most partitions
        t0 = time.monotonic()
        cluster.node(victim).kill()
        before = len(s.acked)
        while len(s.acked) < before + 50:                     # writes go on with two of three
            assert time.monotonic() - t0 < 90, "no write acknowledged after a broker was killed"
            time.sleep(0.2)
        resumed_s = time.monotonic() - t0
        cluster.restart(victim)
        for node in cluster.nodes:                            # a rolling restart of all three
            cluster.restart(node.node_id)
            time.sleep(2)
        time.sleep(3)
    got = _read_all(cluster, topic, expect=len(s.acked))
    numbers = [int(v) for v in got]
    assert s.acked <= set(numbers), f"{len(s.acked - set(numbers))} acknowledged records missing"
    assert len(numbers) == len(set(numbers)), f"{len(numbers) - len(set(numbers))} duplicates"
    print(f"{len(s.acked)} acknowledged, {len(s.failed)} reported failed, writes resumed {resumed_s:.1f}s after "
          f"node {victim} was killed; rolling restart of 3 nodes")


def test_the_cli_clients_find_every_node(cluster: LocalCluster, tmp_path: Path) -> None:
    env: dict[str, str] = {}
    from tools.broker.local_broker import apply_client_env

    assert apply_client_env(cluster.home.parent, access.OPERATOR, env)
    assert env["APPRENTICE_KAFKA_BOOTSTRAP"] == cluster.bootstrap and cluster.bootstrap.count(",") == 2


def test_a_service_refuses_to_start_on_topics_that_would_lose_records(cluster: LocalCluster) -> None:
    """A real service process (weights) on a deployment whose topics were created with one replica on the
    3-broker cluster: exit status 2 and one line naming a topic and the fix, before it serves anything."""
    import subprocess
    import sys

    topics = Topics(prefix=f"weak-{uuid.uuid4().hex[:6]}.")
    ensure_topics(cluster.bootstrap, topics, replication=1, security=cluster.security())
    cluster.ensure_access(topics)
    _metadata(cluster.admin_client(), [s.name for s in topics.specs()])
    env = {**os.environ, **cluster.client_env("weights"), "APPRENTICE_TOPIC_PREFIX": topics.prefix}
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "serve", "weights", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("apprentice weights: topic 'weak-") and "replication factor 1" in line, line
    assert "apprentice topics" in line
