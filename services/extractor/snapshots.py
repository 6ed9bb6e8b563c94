"""The compacted knowledge topic --> every KnowledgeSnapshot on it, read from the beginning to its end.

Used at start-up (the extractor rebuilds its state from the topic, the only durable store it has) and by
`apprentice knowledge show --from-topic` when no extractor is running. The read itself (end offsets taken
at the start, empty partitions, a fresh topic without leaders yet, the time limit) is
shared/kafka/reader.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Message

from shared.contracts.events import UndecodableEvent
from shared.contracts.validation import decode_record
from shared.kafka.reader import read_topic_to_end
from shared.kafka.trust import RecordTrust, UntrustedRecord
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)


def read_snapshots(bootstrap: str, topic: str, *, timeout: float = 30.0, trust: RecordTrust | None = None,
                   on_untrusted: Callable[[Message, UntrustedRecord], None] | None = None,
                   ) -> list[events_pb2.KnowledgeSnapshot]:
    """All decodable snapshots up to the end offsets seen at the start of the call, in log order per
    partition. Undecodable records are logged and skipped. With `trust` (the extractor's start-up passes
    one, `monotonic=True`), a record it refuses (not the extractor's signature, or older than the
    snapshot of its key already read) is left out and handed to `on_untrusted` (the extractor
    dead-letters it), else logged. Raises shared/kafka/reader.py's `TopicMissing` or `ReadTimeout`."""
    out: list[events_pb2.KnowledgeSnapshot] = []
    for m in read_topic_to_end(bootstrap, topic, purpose="extractor-rebuild", timeout_s=timeout):
        if trust is not None:
            try:
                trust.check(m)
            except UntrustedRecord as e:
                if on_untrusted is not None:
                    on_untrusted(m, e)
                else:
                    log.error("skipping untrusted knowledge record", extra={"offset": m.offset(), "error": str(e)})
                continue
        try:
            out.append(decode_record(events_pb2.KnowledgeSnapshot, m.value(), m.headers()))
        except UndecodableEvent as e:
            log.error("skipping undecodable knowledge record", extra={"offset": m.offset(), "error": str(e)})
    return out
