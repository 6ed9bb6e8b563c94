"""A slow extractor LLM never costs the extractor its consumer group membership.

The real Inference service (tiny model) is slowed by its fault injection (`fault_delay_s`) to longer than
the extractor consumer's `max.poll.interval.ms`, lowered for the test. Without the pause-and-poll worker
(shared/kafka/busy.py) the consumer would be thrown out of its group in the middle of the call (librdkafka
reports `max poll interval exceeded`, revokes and reassigns); with it, the membership seen by the broker
stays the same member throughout, no rebalance callback fires after the first assignment, and every
session is extracted and committed once the calls return.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from services.extractor.curation import approx_tokens
from services.extractor.service import ExtractorApp
from services.extractor.settings import ExtractorSettings, InferenceLLMSettings
from shared.contracts.topics import Topics
from shared.kafka.security import librdkafka_config
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.unit.extractor.factories import graded

pytestmark = pytest.mark.integration

MAX_POLL_S = 6.0       # librdkafka: at least the session timeout; the broker's minimum session is 6 s
DELAY_S = 9.0          # every Generate waits this long: 1.5x the poll interval


def _members(admin: AdminClient, group: str) -> tuple[str, list[str]]:
    """(state, member ids) of `group` as the broker sees it."""
    desc = admin.describe_consumer_groups([group])[group].result(10)
    return desc.state.name, sorted(m.member_id for m in desc.members)


def _committed(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}


def test_extractor_keeps_its_group_while_inference_is_slower_than_max_poll_interval(
        topics: Topics, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.inference import start_inference

    monkeypatch.setenv("APPRENTICE_MODEL", "tiny-random")
    inference = start_inference(tmp_path, bootstrap=kafka_bootstrap, topic_prefix=topics.prefix,
                                fault_delay_s=DELAY_S)
    settings = ExtractorSettings(llm=InferenceLLMSettings(endpoint=f"127.0.0.1:{inference.port}"), port=0,
                                 metrics_port=0, session_gap_s=0.0, max_new_tokens=8, batch_size=4,
                                 rate_limit_per_s=100, rate_burst=100, request_timeout_s=60.0,
                                 max_poll_interval_s=MAX_POLL_S)
    app = ExtractorApp(settings, count_tokens=approx_tokens)
    admin = AdminClient({**librdkafka_config(), "bootstrap.servers": kafka_bootstrap})
    group = topics.group_id("extractor")
    qa = [("How long is the warranty?", "The warranty lasts two full years."),
          ("Where is my parcel?", "Parcels leave the Lyon depot within three days."),
          ("Can I pay by invoice?", "Invoices are accepted for business customers only.")]
    records = [graded(session=f"s{i}", iid=f"r{i}", question=q, correction=c) for i, (q, c) in enumerate(qa)]
    p = signed_producer(kafka_bootstrap, "grader")   # graded records are the grader's
    for r in records:        # waiting before the extractor starts: one poll takes them all, one slow batch
        p.produce(topics.graded, r.interaction.session_id, r)
    p.flush()
    try:
        sent = time.monotonic()
        app.start()
        assert app.consumer is not None
        # (the consumer belongs to the extractor's thread: it is only observed here, never called)
        consumer = app.consumer
        wait_for(lambda: consumer.rebalances["assigned"], what="the extractor's partitions", stall_s=30,
                 every=0.1)
        state, members = _members(admin, group)
        assert state == "STABLE" and len(members) == 1
        assigned_at = time.monotonic()

        # while the slow calls are in flight, past the poll interval, the broker still sees the same member
        seen_during_call = False
        deadline = sent + 60
        while time.monotonic() < deadline:
            snap = app.store.latest("acme/support")
            if snap is not None and len(snap.items) >= len(records):
                break
            if time.monotonic() - assigned_at > MAX_POLL_S + 1:   # the batch's calls take DELAY_S
                assert _members(admin, group) == (state, members)
                seen_during_call = True
            time.sleep(0.2)             # the pace of the membership observations while the calls run
        took = time.monotonic() - sent
        snap = app.store.latest("acme/support")
        assert snap is not None and len(snap.items) == len(records), "not everything was extracted"
        assert took >= DELAY_S > MAX_POLL_S     # the LLM really was slower than the poll interval
        assert seen_during_call
        assert app.extractor.calls == len(records)      # one slow batch, no call repeated

        # the offsets past every record are committed once the snapshot is durable
        def all_committed() -> dict[tuple[str, int], int] | None:
            c = _committed(admin, group)
            return c if sum(c.values()) >= len(records) else None

        committed = wait_for(all_committed, what="the offsets past every record committed", stall_s=15, every=0.2)
        assert sum(committed.values()) == len(records)
        # no rebalance and no eviction happened: one assignment, nothing revoked or lost
        assert app.consumer.rebalances == {"assigned": 1, "revoked": 0, "lost": 0}
        assert app.consumer.max_poll_exceeded == 0
        assert _members(admin, group) == (state, members)
    finally:
        app.stop()
        inference.stop(1.0)
