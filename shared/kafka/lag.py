"""Consumer groups of one stack --> committed offset, end offset and lag per group, topic and partition.

One reading for every view of lag (`apprentice status`, the dashboard's health page, tests): the groups
are those of the stack's namespace (their ids carry its topic prefix, shared/contracts/topics.py), the topics those
of the stack, and groups that never commit (tail, probes, the dashboard's readers) are left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from shared.contracts.topics import Topics
from shared.kafka.client_logs import client_log_config
from shared.kafka.consumers import new_consumer
from shared.kafka.reader import watermarks
from shared.kafka.security import SecuritySource, librdkafka_config

PROBE_GROUP = "apprentice-status-probe"
"""The group id of the consumer that reads end offsets (it never subscribes or commits), after the stack's
prefix."""
NEVER_COMMIT = ("apprentice-tail", PROBE_GROUP)


@dataclass(frozen=True)
class PartitionLag:
    group: str
    topic: str
    """Concrete topic name (with the stack's prefix)."""
    partition: int
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - self.committed)


def partition_lag(bootstrap: str, topics: Topics, *, security: SecuritySource = None,
                  skip_groups: tuple[str, ...] = ()) -> list[PartitionLag]:
    """Every committed partition of every group of the `topics` namespace on one of its topics, sorted."""

    ours = {s.name for s in topics.specs()}
    base = {**librdkafka_config(security), **client_log_config(bootstrap), "bootstrap.servers": bootstrap}
    admin = AdminClient(base)
    skip = tuple(topics.group_id(g) for g in NEVER_COMMIT) + skip_groups
    groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(15).valid
              if topics.owns_group(g.group_id) and not g.group_id.startswith(skip)]
    # one request per group (the API takes one at a time), all in flight together: a shared broker may
    # hold many groups of other stacks
    futures = {gid: admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)])[gid] for gid in groups}
    probe = new_consumer(bootstrap, purpose="status-probe", group_id=topics.group_id(PROBE_GROUP),
                         security=security)
    rows: list[PartitionLag] = []
    try:
        for gid, fut in futures.items():
            for tp in fut.result(15).topic_partitions:
                if tp.topic not in ours or tp.offset < 0:
                    continue
                _lo, hi = watermarks(probe, tp.topic, tp.partition, time.monotonic() + 5)
                rows.append(PartitionLag(gid, tp.topic, tp.partition, tp.offset, hi))
    finally:
        probe.close()
    return sorted(rows, key=lambda r: (r.group, r.topic, r.partition))


def lag_by_group(rows: list[PartitionLag]) -> dict[str, dict[str, int]]:
    """{group: {topic: lag summed over partitions}}."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r.group, {}).setdefault(r.topic, 0)
        out[r.group][r.topic] += r.lag
    return out
