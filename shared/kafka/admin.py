"""Create the topics with their partitions and compaction policy; check that a broker answers.

Every function takes `security` (shared/kafka/security.py): None = the client security configured in
the environment, as for every other Kafka client."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from shared.contracts.topics import Topics, TopicSpec
from shared.kafka.authorization import KafkaAccessDenied, denied, is_refusal
from shared.kafka.client_logs import client_log_config
from shared.kafka.durability import cluster_replication
from shared.kafka.security import SecuritySource, librdkafka_config


def admin(bootstrap: str, *, quiet: bool = False, security: SecuritySource = None) -> AdminClient:
    config: dict[str, Any] = {**librdkafka_config(security), **client_log_config(bootstrap),
                              "bootstrap.servers": bootstrap}
    if quiet:
        config["log_level"] = 0  # probing a broker that may be down: connection errors are expected
        del config["error_cb"]
    return AdminClient(config)


def broker_answers(bootstrap: str, timeout: float = 2.0, *, security: SecuritySource = None) -> bool:
    """True when a real metadata request succeeds (with SASL: only after authentication succeeded)."""
    try:
        md = admin(bootstrap, quiet=True, security=security).list_topics(timeout=timeout)
        return bool(md.brokers)
    except KafkaException:
        return False


def wait_for_broker(bootstrap: str, timeout: float = 60.0, *, security: SecuritySource = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker_answers(bootstrap, security=security):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no Kafka broker answered at {bootstrap} within {timeout:.0f}s")


def _new_topic(spec: TopicSpec, replication: int, min_insync: int = 1) -> NewTopic:
    config = {"retention.ms": str(spec.retention_ms), "min.insync.replicas": str(min_insync)}
    if spec.compacted:
        config["cleanup.policy"] = "compact"
        config["min.cleanable.dirty.ratio"] = "0.1"
        config["segment.ms"] = str(3600 * 1000)
    return NewTopic(spec.name, num_partitions=spec.partitions, replication_factor=replication, config=config)


def ensure_topics(bootstrap: str, topics: Topics | None = None, *, replication: int | None = None,
                  timeout: float = 30.0, security: SecuritySource = None) -> list[str]:
    """Create every missing topic; return the names that were created. Existing topics are left alone. A
    principal the broker refuses to create one (or even to see it) gets `KafkaAccessDenied`, whose line names
    the command that grants it.
    `replication` None: from the cluster's size, with min.insync.replicas to match (3 and 2 from three brokers
    on, else 1: shared/kafka/durability.py)."""
    specs = (topics or Topics()).specs()
    client = admin(bootstrap, security=security)
    md = client.list_topics(timeout=timeout)
    existing = set(md.topics)
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    auto_rf, min_insync = cluster_replication(len(md.brokers))
    rf = auto_rf if replication is None else replication
    min_insync = min(min_insync, max(1, rf - 1))
    futures = client.create_topics([_new_topic(s, rf, min_insync) for s in missing], request_timeout=timeout)
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as e:
            if is_refusal(e):
                raise _create_refused(client, name, security, topics or Topics(), timeout) from e
            if e.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: another process won the race
                raise
    # Metadata propagates asynchronously, even on one node.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s.name in client.list_topics(timeout=timeout).topics for s in missing):
            break
        time.sleep(0.2)
    return created


def _create_refused(client: AdminClient, name: str, security: SecuritySource, topics: Topics,
                    timeout: float) -> KafkaAccessDenied:
    """Why the broker refused to create `name`: the topic is missing and this principal may not create it, or
    it exists and this principal may not even describe it (the deployment's ACLs are missing, so it looked
    missing): the line of each names a different command (shared/kafka/authorization.py)."""
    operation = "CREATE"
    try:
        client.describe_topics(TopicCollection([name]), request_timeout=timeout)[name].result(timeout)
    except KafkaException as e:
        if is_refusal(e):
            operation = "DESCRIBE"
    refusal = denied(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), name=name, operation=operation,
                     security=security, prefix=topics.prefix)
    assert refusal is not None
    return refusal


def delete_topics(bootstrap: str, names: list[str], timeout: float = 30.0, *,
                  security: SecuritySource = None) -> None:
    if not names:
        return
    # keep the handle alive: its futures fail with _DESTROY once it is collected
    client = admin(bootstrap, security=security)
    for fut in client.delete_topics(names, operation_timeout=timeout).values():
        with contextlib.suppress(KafkaException):  # already gone
            fut.result(timeout)


def list_topics(bootstrap: str, timeout: float = 10.0, *, security: SecuritySource = None) -> dict[str, int]:
    md = admin(bootstrap, security=security).list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in sorted(md.topics.items()) if not name.startswith("__")}
