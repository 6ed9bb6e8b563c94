"""The compacted knowledge topic --> every KnowledgeSnapshot on it, read from the beginning to its end.

Used at start-up (the extractor rebuilds its state from the topic, the only durable store it has) and by
`apprentice knowledge show --from-topic` when no extractor is running. The read itself (end offsets taken
at the start, empty partitions, a fresh topic without leaders yet, the time limit) is
shared/kafka/reader.py's.
"""

from __future__ import annotations

import logging

from shared.contracts.events import UndecodableEvent
from shared.contracts.validation import decode_record
from shared.kafka.reader import read_topic_to_end
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)


def read_snapshots(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[events_pb2.KnowledgeSnapshot]:
    """All decodable snapshots up to the end offsets seen at the start of the call, in log order per
    partition. Undecodable records are logged and skipped (they cannot be dead-lettered from a read).
    Raises shared/kafka/reader.py's `TopicMissing` or `ReadTimeout` (a `TimeoutError`)."""
    out: list[events_pb2.KnowledgeSnapshot] = []
    for m in read_topic_to_end(bootstrap, topic, purpose="extractor-rebuild", timeout_s=timeout):
        try:
            out.append(decode_record(events_pb2.KnowledgeSnapshot, m.value(), m.headers()))
        except UndecodableEvent as e:
            log.error("skipping undecodable knowledge record", extra={"offset": m.offset(), "error": str(e)})
    return out
