"""A local replicated KRaft cluster: `apprentice kafka start --brokers 3`.

Each node is a `LocalBroker` (tools/broker/local_broker.py: the same jars, SASL listener, authorizer, users and
ACLs) in combined mode (broker and controller in one JVM), node `i` listening on `port + 100*(i-1)` with its
controller on the next port: 9092/9093, 9192/9193, 9292/9293. Combined mode because on one machine a separate
controller quorum would add three more JVMs and test nothing more: losing a combined node loses a voter and a
broker at once, the harder case, and a quorum of three survives one loss either way.

Replication: the internal topics (offsets, transactions) and every topic `ensure_topics` creates get
replication factor 3 and `min.insync.replicas=2` (shared/kafka/durability.py), so an acknowledged record
(producers use acks=all) is on two brokers and writes go on with one broker down.

The layout (`<home>/kafka/cluster.json`: node count, ports, cluster id; each node under
`<home>/kafka/cluster/node-<i>/`, its log in `<home>/logs/kafka-<i>.log`) is kept apart from the single broker's
data folder: a KRaft metadata log formatted for one voter cannot join a quorum of three. The credentials folder
is shared, so the same principals and passwords work against either.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient

from shared.contracts import topic_access as access
from shared.kafka.admin import admin
from shared.kafka.durability import cluster_replication
from shared.kafka.security import KafkaSecurity
from tools.broker.acls import Grant
from tools.broker.local_broker import (
    CLUSTER_FILE,
    DEFAULT_PORT,
    PORT_STEP,
    BrokerError,
    BrokerStatus,
    LocalBroker,
)

if TYPE_CHECKING:
    from shared.contracts.topics import Topics
    from shared.settings import CommonSettings


class ClusterNode(LocalBroker):
    """One node of the cluster: a `LocalBroker` with its own id, folder, pid file and log, in a quorum."""

    def __init__(self, home: Path, *, node_id: int, voters: str, cluster_id: str, replication: int,
                 min_insync: int, host: str, port: int, heap: str) -> None:
        super().__init__(home, host=host, port=port, controller_port=port + 1, heap=heap)
        self.node_id, self.voters, self.cluster_id = node_id, voters, cluster_id
        self.replication, self.min_insync = replication, min_insync
        self.dir = self.home / "cluster" / f"node-{node_id}"
        self.data = self.dir / "data"
        self.pid_file = self.dir / "broker.pid"
        self.log_file = home / "logs" / f"kafka-{node_id}.log"

    @property
    def properties_file(self) -> Path:
        return self.dir / "server.properties"

    def _cluster_id(self) -> str:  # type: ignore[override]  # every node formats with the cluster's one id
        return self.cluster_id

    def kill(self) -> int | None:
        """SIGKILL this node's JVM (a crash, for chaos drills); its pid, None when it was not running."""
        pid = self._owned_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            while self._owned_pid() is not None:
                time.sleep(0.05)
        return pid


@dataclass
class ClusterStatus:
    bootstrap: str
    nodes: list[BrokerStatus]

    @property
    def running(self) -> int:
        return sum(n.running for n in self.nodes)


class LocalCluster:
    """`brokers` combined KRaft nodes on this machine (module docstring). The same life-cycle calls as a
    `LocalBroker`: `start`, `stop`, `status`, `security`, `client_env`, `admin_client`."""

    def __init__(self, home: Path, brokers: int = 3, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 heap: str = "512m") -> None:
        if brokers < 1:
            raise BrokerError("a cluster needs at least one broker")
        self.home = home / "kafka"
        self.layout_file = self.home / CLUSTER_FILE
        layout = self._layout(brokers, host, port)
        self.brokers, self.host, self.port = brokers, host, port
        rf, isr = cluster_replication(brokers)
        voters = ",".join(f"{i}@{host}:{port + PORT_STEP * (i - 1) + 1}" for i in range(1, brokers + 1))
        self.nodes = [ClusterNode(home, node_id=i, voters=voters, cluster_id=str(layout["cluster_id"]), replication=rf,
                                  min_insync=isr, host=host, port=port + PORT_STEP * (i - 1), heap=heap)
                      for i in range(1, brokers + 1)]

    def _layout(self, brokers: int, host: str, port: int) -> dict[str, str | int]:
        """The recorded layout (written on first use); a different one recorded before is an error: the nodes'
        metadata logs were formatted for that quorum."""
        want: dict[str, str | int] = {"brokers": brokers, "host": host, "port": port}
        if self.layout_file.exists():
            have = json.loads(self.layout_file.read_text())
            if {k: have.get(k) for k in want} != want:
                raise BrokerError(f"{self.layout_file} records a cluster of {have.get('brokers')} brokers at "
                                  f"{have.get('host')}:{have.get('port')}: stop it and remove {self.home / 'cluster'} "
                                  "and that file to make another")
            return dict(have)
        layout = {**want, "cluster_id": LocalBroker._cluster_id()}
        self.home.mkdir(parents=True, exist_ok=True)
        self.layout_file.write_text(json.dumps(layout))
        return layout

    @classmethod
    def recorded(cls, home: Path) -> LocalCluster | None:
        """The cluster `home` records (`apprentice kafka start --brokers N` wrote it), else None."""
        f = home / "kafka" / CLUSTER_FILE
        if not f.exists():
            return None
        layout = json.loads(f.read_text())
        return cls(home, int(layout["brokers"]), host=str(layout["host"]), port=int(layout["port"]))

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def sasl_dir(self) -> Path:
        return self.nodes[0].sasl_dir

    def security(self, principal: str = access.ADMIN) -> KafkaSecurity:
        return self.nodes[0].security(principal)

    def client_env(self, principal: str) -> dict[str, str]:
        """As `LocalBroker.client_env`, bootstrapping from every node (a client started while one is down
        still finds the cluster)."""
        return {**self.nodes[0].client_env(principal), "APPRENTICE_KAFKA_BOOTSTRAP": self.bootstrap}

    def admin_client(self) -> AdminClient:
        return admin(self.bootstrap, security=self.security(access.ADMIN))

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id - 1]

    def start(self, timeout: float = 120.0, topics: Topics | None = None) -> ClusterStatus:
        """Launch every node that is not running (a quorum forms only once a majority runs, so all are
        launched before any is waited for), then wait until each answers and set up the users and ACLs."""
        for n in self.nodes:
            if n._owned_pid() is None and not n._answers(timeout=1.0):
                if n._port_open():
                    raise BrokerError(n.refusal())
                n.launch()
        deadline = time.monotonic() + timeout
        pending = list(self.nodes)
        while pending:
            pending = [n for n in pending if not n._answers(timeout=1.0)]
            for n in pending:
                n.check_alive()
            if pending and time.monotonic() > deadline:
                raise BrokerError(f"nodes {[n.node_id for n in pending]} did not answer within {timeout:.0f}s; "
                                  f"see {pending[0].log_file}")
            if pending:
                time.sleep(0.5)
        self.ensure_access(topics, timeout=max(30.0, deadline - time.monotonic()))
        return self.status()

    def ensure_access(self, topics: Topics | None = None, timeout: float = 30.0) -> list[Grant]:
        """Users and ACLs live in the cluster's metadata: set once, through the first node."""
        return self.nodes[0].ensure_access(topics, timeout)

    def stop(self, timeout: float = 30.0) -> bool:
        stopped = [n.stop(timeout) for n in self.nodes]
        return any(stopped)

    def status(self) -> ClusterStatus:
        return ClusterStatus(self.bootstrap, [n.status() for n in self.nodes])

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Stop one node cleanly and start it again, waiting until it answers (a rolling restart's step)."""
        n = self.node(node_id)
        n.stop()
        n.launch()
        deadline = time.monotonic() + timeout
        while not n._answers(timeout=1.0):
            n.check_alive()
            if time.monotonic() > deadline:
                raise BrokerError(f"node {node_id} did not answer within {timeout:.0f}s after a restart")
            time.sleep(0.5)

    def under_replicated(self, timeout: float = 10.0) -> list[str]:
        """`topic[partition]` of every partition whose in-sync replicas are fewer than its replicas."""
        md = self.admin_client().list_topics(timeout=timeout)
        return sorted(f"{name}[{p}]" for name, t in md.topics.items() for p, meta in t.partitions.items()
                      if len(meta.isrs) < len(meta.replicas))

    def wait_in_sync(self, timeout: float = 120.0) -> float:
        """Until every partition's replicas are all in sync again (what an operator waits for between the steps
        of a rolling restart); the seconds it took."""
        t0 = time.monotonic()
        while (left := self.under_replicated()):
            if time.monotonic() - t0 > timeout:
                raise BrokerError(f"{len(left)} partitions still under-replicated after {timeout:.0f}s: {left[:5]}")
            time.sleep(0.5)
        return time.monotonic() - t0

    def busiest_leader(self, topics: list[str], timeout: float = 10.0) -> int:
        """The node leading the most partitions of `topics` (the one whose loss moves the most leaders)."""
        counts: dict[int, int] = {}
        for topic in topics:
            for leader in self.leaders(topic, timeout).values():
                counts[leader] = counts.get(leader, 0) + 1
        return max(sorted(counts), key=lambda n: counts[n])

    def leaders(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """Partition --> the node id leading it now."""
        md = self.admin_client().list_topics(topic, timeout=timeout).topics[topic]
        return {p: meta.leader for p, meta in md.partitions.items()}


def home_broker(settings: CommonSettings) -> LocalBroker | LocalCluster:
    """This home's Kafka: the cluster it records (`apprentice kafka start --brokers N`), else its single
    broker at the settings' address."""
    return LocalCluster.recorded(settings.home) or LocalBroker.for_settings(settings)
