"""Event ids + a topic + a start time --> the ids found there (confluent-kafka, read_committed).

The emission recovery (recovery.py) asks this to tell an emission that reached the graded
topic before a crash from one that did not: Kafka's time index finds each partition's first offset at
`since`, and the partitions are read from there to their end.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from shared.kafka.client_logs import client_log_config
from shared.kafka.security import librdkafka_config
from shared.proto.apprentice.v1 import events_pb2


def find_event_ids(bootstrap: str, topic: str, wanted: set[str], since: float,
                   timeout: float = 30.0) -> set[str]:
    """Which of `wanted` event ids are in `topic` at or after wall-clock time `since` (all partitions)."""
    c = Consumer({**librdkafka_config(), **client_log_config(bootstrap), "bootstrap.servers": bootstrap, "group.id": f"grader-verify-{uuid.uuid4()}",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    found: set[str] = set()
    try:
        md = c.list_topics(topic, timeout=timeout)
        parts = list(md.topics[topic].partitions)
        starts = c.offsets_for_times([TopicPartition(topic, p, max(0, int(since * 1000))) for p in parts],
                                     timeout=timeout)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in parts}
        assign = [tp for tp in starts if tp.offset >= 0 and tp.offset < ends[tp.partition]]
        if not assign:
            return found
        c.assign(assign)
        remaining = {tp.partition for tp in assign}
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    continue
                try:
                    eid = events_pb2.GradedInteraction.FromString(m.value()).envelope.event_id
                except Exception:  # noqa: BLE001 - a foreign record is simply not ours
                    eid = ""
                if eid in wanted:
                    found.add(eid)
                if (m.offset() or 0) + 1 >= ends[m.partition() or 0]:
                    remaining.discard(m.partition())
        if remaining:
            raise TimeoutError(f"could not read {topic} partitions {sorted(remaining)} to their end")
    finally:
        c.close()
    return found
