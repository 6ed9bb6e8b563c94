"""The grader's internal topics, and a table changelog read back into memory (confluent-kafka).

Both runtimes use the same internal topics (names from faust's conventions, so that either runtime
finds the other's state): the join topic (items keyed by interaction id), the judge topic (keyed by
group id) and the compacted changelogs of the `pending` and `judge-groups` tables. faust creates them
itself; the native runtime creates the missing ones with the same layout.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic, OffsetSpec

from services.grader.settings import GraderSettings
from shared.kafka.admin import admin
from shared.kafka.client_logs import client_log_config
from shared.kafka.security import librdkafka_config
from shared.retry import call

log = logging.getLogger(__name__)


def internal_topics(settings: GraderSettings) -> list[NewTopic]:
    """The join and judge topics (a week of retention, like the sources), the two compacted changelogs, and
    the runtime-rules topic when the stack's topics were created before it existed."""
    P, R = settings.partitions, settings.replication
    week = {"retention.ms": str(7 * 24 * 3600 * 1000)}
    compacted = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", "segment.ms": str(3600 * 1000)}
    return [NewTopic(settings.join_topic, P, R, config=week), NewTopic(settings.judge_topic, P, R, config=week),
            NewTopic(settings.pending_changelog, P, R, config=compacted),
            NewTopic(settings.judge_changelog, P, R, config=compacted),
            # the runtime rules (a contract topic, shared/contracts/topics.py; `apprentice topics` creates it too)
            NewTopic(settings.common.topics.grader_rules, 1, R, config={**compacted, "retention.ms": "-1"})]


def ensure_internal_topics(settings: GraderSettings, timeout: float = 30.0) -> list[str]:
    """Create the internal topics that do not exist yet; return their names."""
    client = admin(settings.common.kafka_bootstrap, security=settings.common)
    existing = set(client.list_topics(timeout=timeout).topics)
    missing = [t for t in internal_topics(settings) if t.topic not in existing]
    created = []
    for name, fut in (client.create_topics(missing, request_timeout=timeout).items() if missing else []):
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another worker won the race
                raise
    deadline = time.monotonic() + timeout
    while missing and time.monotonic() < deadline:  # metadata propagates asynchronously
        if {t.topic for t in missing} <= set(client.list_topics(timeout=timeout).topics):
            break
        time.sleep(0.2)
    return created


def read_table(bootstrap: str, topic: str, partitions: list[int], *, timeout_s: float,
               settle_s: float = 0.0, extra: dict[str, Any] | None = None) -> dict[int, dict[bytes, bytes]]:
    """The latest committed value per key of `partitions` of the changelog `topic`, read from the
    beginning to the end (tombstones delete). read_committed: an aborted transaction is not state.

    A transaction still unresolved at the end of a partition is waited for, up to `settle_s`: the
    previous owner's last commit (whose markers the coordinator writes after answering it), or a dead
    owner's transaction that the broker will abort. Reading only up to it would lose the states of a
    commit that is being completed."""
    out: dict[int, dict[bytes, bytes]] = {p: {} for p in partitions}
    if not partitions:
        return out
    if settle_s > 0:
        wait_for_resolved_end(bootstrap, topic, partitions, settle_s)
    c = Consumer({**librdkafka_config(), **client_log_config(bootstrap), "bootstrap.servers": bootstrap,
                  "group.id": f"grader-restore-{uuid.uuid4()}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", **(extra or {})})
    try:
        deadline = time.monotonic() + timeout_s
        todo = {p for p in partitions if _has_records(c, TopicPartition(topic, p), deadline)}
        if todo:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(todo)])
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} partitions {sorted(todo)} to their end "
                                   f"within {timeout_s:.0f}s")
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(m.partition())
                    elif err.fatal():
                        raise KafkaException(err)
                    continue
                table = out[m.partition() or 0]
                key, value = m.key() or b"", m.value()
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
    finally:
        c.close()
    return out


def wait_for_resolved_end(bootstrap: str, topic: str, partitions: list[int], timeout_s: float) -> bool:
    """Wait until no transaction is open at the end of `partitions` (the last stable offset has caught
    up with the high watermark); False if some still are after `timeout_s`."""
    client = admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    tps = [TopicPartition(topic, p) for p in partitions]
    while True:
        ends = call(lambda: {level: _latest(client, tps, level, deadline)
                             for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)},
                    retry_on=_not_ready_error, what=f"end offsets of {topic}", attempts=None,
                    deadline_s=max(0.0, deadline - time.monotonic()), first_s=0.2, max_s=1.0)
        stable, high = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
        open_ = [p for p in partitions if stable[p] < high[p]]
        if not open_:
            return True
        if time.monotonic() > deadline:
            log.warning("a transaction is still open at the end of the changelog; reading what is committed",
                        extra={"topic": topic, "partitions": open_})
            return False
        time.sleep(0.2)


def _latest(client: Any, tps: list[TopicPartition], level: IsolationLevel, deadline: float) -> dict[int, int]:
    futs = client.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=level,
                               request_timeout=max(1.0, deadline - time.monotonic()))
    return {tp.partition: f.result().offset for tp, f in futs.items()}


def _not_ready(e: KafkaException) -> bool:
    """A retriable error, or a partition whose leader is not known yet (a topic created moments ago)."""
    return bool(e.args[0].retriable()) or e.args[0].code() in _NOT_READY


def _not_ready_error(e: BaseException) -> bool:
    return isinstance(e, KafkaException) and _not_ready(e)


def _has_records(c: Consumer, tp: TopicPartition, deadline: float) -> bool:
    """Whether the partition holds anything, asking again while its leader is not known yet (a topic
    created moments ago)."""
    low, high = call(lambda: c.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic())),
                     retry_on=_not_ready_error, what=f"watermarks of {tp.topic}/{tp.partition}", attempts=None,
                     deadline_s=max(0.0, deadline - time.monotonic()), first_s=0.2, max_s=1.0)
    return bool(high > low)


_NOT_READY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
