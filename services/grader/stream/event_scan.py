"""Event ids + a topic + a start time --> the ids found there (confluent-kafka, read_committed).

The emission recovery (recovery.py) asks this to tell an emission that reached the graded
topic before a crash from one that did not: Kafka's time index finds each partition's first offset at
`since`, and shared/kafka/reader.py reads the partitions from there to their end.
"""

from __future__ import annotations

from shared.kafka.reader import read_topic_to_end
from shared.kafka.trust import RecordTrust, UntrustedRecord
from shared.proto.apprentice.v1 import events_pb2


def find_event_ids(bootstrap: str, topic: str, wanted: set[str], since: float,
                   timeout: float = 30.0, *, trust: RecordTrust | None = None) -> set[str]:
    """Which of `wanted` event ids are in `topic` at or after wall-clock time `since` (all partitions).
    `trust`: only records it accepts count (a graded record forged by another principal with a wanted
    event id must not make recovery believe the grader's own emission reached the topic)."""
    found: set[str] = set()
    for m in read_topic_to_end(bootstrap, topic, purpose="grader-verify", since_s=since, timeout_s=timeout):
        try:
            if trust is not None:
                trust.check(m)
        except UntrustedRecord:
            continue  # not the grader's: as good as absent
        try:
            eid = events_pb2.GradedInteraction.FromString(m.value()).envelope.event_id
        except Exception:  # noqa: BLE001 - a foreign record is simply not ours
            continue
        if eid in wanted:
            found.add(eid)
    return found
