"""The compacted knowledge topic --> every KnowledgeSnapshot on it, read from the beginning to its end.

Used at start-up (the extractor rebuilds its state from the topic, the only durable store it has) and by
`apprentice knowledge show --from-topic` when no extractor is running.
"""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from shared.contracts.events import UndecodableEvent
from shared.contracts.validation import decode_record
from shared.kafka.client_logs import client_log_config
from shared.kafka.security import librdkafka_config
from shared.proto.apprentice.v1 import events_pb2
from shared.retry import call

log = logging.getLogger(__name__)


def read_snapshots(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[events_pb2.KnowledgeSnapshot]:
    """All decodable snapshots up to the end offsets seen at the start of the call, in log order per
    partition. Undecodable records are logged and skipped (they cannot be dead-lettered from a read)."""
    c = Consumer({**librdkafka_config(), **client_log_config(bootstrap), "bootstrap.servers": bootstrap,
                  "group.id": f"extractor-rebuild-{uuid.uuid4()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    out: list[events_pb2.KnowledgeSnapshot] = []
    try:
        md = c.list_topics(topic, timeout=timeout)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"knowledge topic {topic!r} is not available: {meta.error if meta else 'missing'}")
        ends: dict[int, int] = {}
        assign: list[TopicPartition] = []
        deadline = time.monotonic() + timeout
        for p in meta.partitions:
            lo, hi = _watermarks(c, TopicPartition(topic, p), deadline)
            if hi > lo:
                ends[p] = hi
                assign.append(TopicPartition(topic, p, lo))
        if not assign:
            return out
        c.assign(assign)
        while ends and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            part, err = int(m.partition() or 0), m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("reading knowledge topic: %s", err)
                elif part in ends and c.position([TopicPartition(topic, part)])[0].offset >= ends[part]:
                    ends.pop(part, None)
                continue
            if int(m.offset() or 0) >= ends.get(part, 0) - 1:
                ends.pop(part, None)
            try:
                out.append(decode_record(events_pb2.KnowledgeSnapshot, m.value(), m.headers()))
            except UndecodableEvent as e:
                log.error("skipping undecodable knowledge record", extra={"offset": m.offset(), "error": str(e)})
        if ends:
            raise TimeoutError(f"could not read {topic!r} to its end within {timeout:.0f}s (left: {sorted(ends)})")
    finally:
        c.close()
    return out


def _watermarks(c: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """(low, high) offsets; retries while a fresh topic's partitions have no leader yet."""
    def transient(e: BaseException) -> bool:
        return isinstance(e, KafkaException) and (e.args[0].retriable() or e.args[0].code() in _TRANSIENT)

    def once() -> tuple[int, int]:
        low, high = c.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
        return low, high

    return call(once, retry_on=transient, what=f"watermarks of {tp.topic}[{tp.partition}]", attempts=None,
                deadline_s=max(0.0, deadline - time.monotonic()), first_s=0.2, max_s=1.0)


_TRANSIENT = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}
