"""What makes an acknowledged record survive the loss of a broker, checked at start rather than hoped for.

Producers: `acks=all` (the leader answers only once every in-sync replica holds the record) and
`enable.idempotence` (a retry after a lost answer is not a second copy, and per-partition order holds).
`durable_producer` is the one way Apprentice code builds a raw librdkafka producer (shared/kafka/producer.py's
`EventProducer` and the inference capture sink use it too); it refuses a configuration that weakens either,
naming the setting to change.

Topics: on a cluster of three or more brokers a topic needs a replication factor of at least 3 and
`min.insync.replicas` of at least 2, with the factor above `min.insync.replicas` (so that a write still
succeeds with one replica down, and an acknowledged write is on two brokers when one is lost). On one or two
brokers there is nothing to fail over to and the check passes with a factor of 1 (the single local broker).
`ensure_topics` (shared/kafka/admin.py) creates topics that pass; `require_durable_topics` is what every
service runs at start, so a topic created by hand with fewer replicas stops the service with the command that
fixes it (`UnsafeKafkaConfig`, reported in one line by shared/startup.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from shared.kafka.authorization import check_access
from shared.kafka.security import librdkafka_config

log = logging.getLogger(__name__)

CLUSTER_BROKERS = 3
"""From this many brokers on, topics must be replicated (`cluster_replication`)."""
REPLICATION = 3
MIN_INSYNC = 2


class UnsafeKafkaConfig(ValueError):
    """A producer or topic setting would let an acknowledged record be lost (or duplicated) when a broker goes;
    the message names the setting to change. A startup error (shared/startup.py)."""


def cluster_replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for new topics on a cluster of `brokers` brokers."""
    if brokers >= CLUSTER_BROKERS:
        return REPLICATION, MIN_INSYNC
    return 1, 1


def producer_problems(config: Mapping[str, Any]) -> list[str]:
    """What in a librdkafka producer configuration lets a record be lost or written twice ([] = nothing)."""
    problems = []
    acks = str(config.get("acks", config.get("request.required.acks", "all"))).lower()
    if acks not in ("all", "-1"):
        problems.append(f"acks={acks}: set acks=all (the leader must wait for every in-sync replica)")
    if str(config.get("enable.idempotence", "false")).lower() not in ("true", "1"):
        problems.append("enable.idempotence is off: set enable.idempotence=true (a retried send must not be a "
                        "second copy)")
    return problems


def durable_producer(config: Mapping[str, Any]) -> Producer:
    """A librdkafka producer with acks=all and idempotence (added when absent, refused when weakened)."""
    full = {"acks": "all", "enable.idempotence": True, **config}
    problems = producer_problems(full)
    if problems:
        raise UnsafeKafkaConfig("unsafe Kafka producer: " + "; ".join(problems))
    return Producer(full)


def topic_problems(client: AdminClient, names: Iterable[str], timeout: float = 15.0) -> list[str]:
    """Why each of `names` (those that exist) could lose acknowledged records when one broker of this cluster
    goes; [] on a cluster of fewer than `CLUSTER_BROKERS` brokers."""
    md = client.list_topics(timeout=timeout)
    if len(md.brokers) < CLUSTER_BROKERS:
        return []
    present = [n for n in names if n in md.topics and md.topics[n].partitions]
    if not present:
        return []
    configs = topic_configs(client, present, timeout)
    problems = []
    for name in present:
        rf = min(len(p.replicas) for p in md.topics[name].partitions.values())
        entry = configs[name].get("min.insync.replicas")
        isr = int(entry.value) if entry is not None and entry.value else 1
        if rf < REPLICATION or isr < MIN_INSYNC or rf <= isr:
            problems.append(
                f"topic {name!r} has replication factor {rf} and min.insync.replicas={isr} on a "
                f"{len(md.brokers)}-broker cluster: it needs a factor of at least {REPLICATION} above "
                f"min.insync.replicas >= {MIN_INSYNC} (recreate it with `apprentice topics`, which chooses "
                f"both from the cluster's size, or raise them with kafka-reassign-partitions and "
                f"`kafka-configs --alter --add-config min.insync.replicas={MIN_INSYNC}`)")
    return problems


def topic_configs(client: AdminClient, names: list[str], timeout: float) -> dict[str, Any]:
    """Each topic's configuration; asked again for a few seconds while a broker that has not caught up with a
    topic created a moment ago answers that it does not know it."""
    deadline = time.monotonic() + min(timeout, 5.0)
    while True:
        futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names],
                                          request_timeout=timeout)
        try:
            return {res.name: fut.result(timeout) for res, fut in futures.items()}
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def require_durable_topics(client: AdminClient, names: Iterable[str], timeout: float = 15.0) -> None:
    """`UnsafeKafkaConfig` naming every topic of `names` that `topic_problems` finds."""
    problems = topic_problems(client, names, timeout)
    if problems:
        raise UnsafeKafkaConfig("; ".join(problems))


def check_at_start(settings: Any, *, timeout: float = 5.0, replication: int | None = None) -> None:
    """A service's start-up check of its cluster (`settings`: CommonSettings): `UnsafeKafkaConfig` when the
    contract topics (or `replication`, the factor the service itself creates topics with, e.g. the grader's
    changelogs; 0 = from the cluster's size, always enough) could lose acknowledged records when one broker
    goes. A broker that does not answer within `timeout` is not waited for (services start before their broker
    and reconnect; the next start checks again). Before that, `KafkaAccessDenied` when the broker refuses this
    principal what the access table grants it (`check_access`: a deployment whose ACLs were not applied)."""
    # (not shared/kafka/admin.py's `admin`: that module imports this one)
    client = AdminClient({**librdkafka_config(settings), "bootstrap.servers": settings.kafka_bootstrap,
                          "log_level": 0})
    try:
        brokers = len(client.list_topics(timeout=timeout).brokers)
    except KafkaException:
        log.warning("kafka durability not checked: no broker answered", extra={"bootstrap": settings.kafka_bootstrap})
        return
    # what the access table grants this principal, asked of the broker: a missing ACL stops the start here,
    # in one line naming the command that grants it (shared/kafka/authorization.py)
    check_access(client, settings, timeout=timeout)
    if replication and brokers >= CLUSTER_BROKERS and replication < REPLICATION:
        raise UnsafeKafkaConfig(f"this service creates its own topics with replication factor {replication} on a "
                                f"{brokers}-broker cluster: set its replication setting to {REPLICATION}")
    try:
        problems = topic_problems(client, [s.name for s in settings.topics.specs()], timeout=timeout)
    except KafkaException as e:
        log.warning("kafka durability not checked: %s", e.args[0].str() if e.args else e)
        return
    if problems:
        raise UnsafeKafkaConfig("; ".join(problems))
