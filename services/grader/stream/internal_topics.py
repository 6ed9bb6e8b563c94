"""The grader's internal topics, created before the faust worker subscribes (service.py says why).

The join topic (items keyed by interaction id), the judge topic (keyed by group id) and the compacted
changelogs of the `pending` and `judge-groups` tables, under faust's own names for them (settings.py), so
that faust finds them as it would have created them.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from services.grader.settings import GraderSettings
from shared.kafka.admin import admin
from shared.kafka.durability import MIN_INSYNC, REPLICATION, cluster_replication


def internal_topics(settings: GraderSettings, brokers: int = 1) -> list[NewTopic]:
    """The join and judge topics (a week of retention, like the sources), the two compacted changelogs, and
    the runtime-rules topic when the stack's topics were created before it existed; replicated as the
    cluster of `brokers` brokers needs (settings.replication 0) or as set."""
    P, R = settings.join_partitions, settings.replication or cluster_replication(brokers)[0]
    isr = {"min.insync.replicas": str(MIN_INSYNC if R >= REPLICATION else 1)}
    week = {"retention.ms": str(7 * 24 * 3600 * 1000), **isr}
    compacted = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", "segment.ms": str(3600 * 1000),
                 **isr}
    return [NewTopic(settings.join_topic, P, R, config=week), NewTopic(settings.judge_topic, P, R, config=week),
            NewTopic(settings.pending_changelog, P, R, config=compacted),
            NewTopic(settings.judge_changelog, P, R, config=compacted),
            # the runtime rules (a contract topic, shared/contracts/topics.py; `apprentice topics` creates it too)
            NewTopic(settings.common.topics.grader_rules, 1, R, config={**compacted, "retention.ms": "-1"})]


def ensure_internal_topics(settings: GraderSettings, timeout: float = 30.0) -> list[str]:
    """Create the internal topics that do not exist yet; return their names. A replication of 0 is resolved
    here, in `settings`, to the cluster's (faust's app, built next, creates anything missing with it)."""
    client = admin(settings.common.kafka_bootstrap, security=settings.common)
    md = client.list_topics(timeout=timeout)
    existing = set(md.topics)
    if not settings.replication:
        settings.replication = cluster_replication(len(md.brokers))[0]
    missing = [t for t in internal_topics(settings, len(md.brokers)) if t.topic not in existing]
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

