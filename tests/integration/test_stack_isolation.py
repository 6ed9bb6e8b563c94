"""Two stacks on one broker, told apart only by APPRENTICE_TOPIC_PREFIX, never share a consumer group.

Stack A and stack B each run a real grader (`python -m services.grader`, its default runtime) and a real
extractor with their default group names. Traffic goes to A only. The Kafka admin API then shows: every
group of one stack carries its prefix and no member of it reads the other stack's topics; B's groups
have no members in common with A's, and report no lag from A's traffic; A graded and extracted everything.
Before group ids carried the prefix, both extractors joined the one group `extractor` and both faust
graders shared their app id only because the grader prefixed it by hand.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from services.extractor.curation import approx_tokens
from services.extractor.service import ExtractorApp
from services.extractor.settings import ExtractorSettings
from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.kafka.lag import lag_by_group, partition_lag
from shared.kafka.security import librdkafka_config
from tests.helpers.grader import GraderProcess, delete_namespace, feedback, grader_env, interaction
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
version: iso-1
tasks:
  - tenant: demo
    task: support
    feedback_window_s: 1
    graders:
      - {name: corrected, type: feedback, kind: correction}
"""

QA = [("How long is the warranty?", "The warranty lasts two full years."),
      ("Where is my parcel?", "Parcels leave the Lyon depot within three days."),
      ("Can I pay by invoice?", "Invoices are accepted for business customers only.")]


class Stack:
    """One namespace: its topics, a grader process and an extractor consuming in a thread."""

    def __init__(self, bootstrap: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
        ensure_topics(bootstrap, self.topics)
        cfg = home / "grader.yaml"
        cfg.write_text(CONFIG)
        self.grader = GraderProcess(grader_env(self.topics.prefix, bootstrap, cfg, home), home / "grader.log")
        monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", self.topics.prefix)
        self.extractor = ExtractorApp(ExtractorSettings(port=0, metrics_port=0, session_gap_s=0.0,
                                                        llm_items=False), count_tokens=approx_tokens)

    def start(self) -> None:
        self.grader.start()
        self.extractor.start()

    def stop(self) -> None:
        self.extractor.stop()
        self.grader.stop()


@pytest.fixture
def stacks(kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Stack, Stack]]:
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("APPRENTICE_MODEL", "tiny-random")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Stack(kafka_bootstrap, tmp_path / "a", monkeypatch)
    b = Stack(kafka_bootstrap, tmp_path / "b", monkeypatch)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        for s in (a, b):
            s.stop()
            delete_namespace(kafka_bootstrap, s.topics.prefix)


def _groups(admin: AdminClient, prefix: str) -> dict[str, list[tuple[str, set[str]]]]:
    """{group: [(member id, topics assigned to it)]} for every group whose id starts with `prefix`."""
    ids = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(15).valid
           if g.group_id.startswith(prefix)]
    out: dict[str, list[tuple[str, set[str]]]] = {}
    for gid, fut in admin.describe_consumer_groups(ids).items() if ids else []:
        desc = fut.result(10)
        out[gid] = [(m.member_id, {tp.topic for tp in m.assignment.topic_partitions}) for m in desc.members]
    return out


def test_two_prefixes_on_one_broker_have_disjoint_groups_and_lag(stacks: tuple[Stack, Stack],
                                                                 kafka_bootstrap: str) -> None:
    a, b = stacks
    admin = AdminClient({**librdkafka_config(), "bootstrap.servers": kafka_bootstrap})
    expected = ("extractor", "apprentice-grader")
    # both stacks are up: each one's grader and extractor groups exist under its own prefix
    for s in (a, b):
        def joined(s: Any = s) -> bool:
            return all(len(_groups(admin, s.topics.prefix).get(s.topics.group_id(n), [])) == 1 for n in expected)
        wait_for(joined, what=f"the groups of {s.topics.prefix}", stall_s=90, every=0.3)

    # interactions and feedback stand in for inference's: signed as inference, as the grader requires
    producer = signed_producer(kafka_bootstrap, "inference", client_id="iso-test")
    ids = []
    for q, correction in QA:
        it = interaction(messages=[("user", q)], text="I do not know.")
        producer.produce(a.topics.interactions, it.session_id, it)
        producer.produce(a.topics.feedback, it.interaction_id,
                         feedback(it.interaction_id, kind="correction", value=0.0, comment=correction))
        ids.append(it.interaction_id)
    producer.flush()

    # A processed everything: graded (window 1 s), then one knowledge item per correction
    def a_done() -> bool:
        snap = a.extractor.store.latest("demo/support")
        return snap is not None and len(snap.items) == len(QA)
    wait_for(a_done, what="stack A's knowledge", stall_s=90, every=0.3)
    wait_for(lambda: all(v == 0 for lags in lag_by_group(partition_lag(kafka_bootstrap, a.topics)).values()
                         for v in lags.values()), what="stack A's lag to reach 0", stall_s=30,
             every=0.3)

    groups_a = _groups(admin, a.topics.prefix)
    groups_b = _groups(admin, b.topics.prefix)
    assert {a.topics.group_id(n) for n in expected} <= set(groups_a)
    assert {b.topics.group_id(n) for n in expected} <= set(groups_b)
    assert not set(groups_a) & set(groups_b)
    # no member of one stack's groups reads the other stack's topics, and no member is in both
    for groups, prefix in ((groups_a, a.topics.prefix), (groups_b, b.topics.prefix)):
        for gid, members in groups.items():
            for _member, assigned in members:
                assert all(t.startswith(prefix) for t in assigned), (gid, assigned)
    members_a = {m for members in groups_a.values() for m, _ in members}
    members_b = {m for members in groups_b.values() for m, _ in members}
    assert members_a and members_b and not members_a & members_b

    # the lag readers of each stack see only their own groups; B saw none of A's traffic
    lag_a = lag_by_group(partition_lag(kafka_bootstrap, a.topics))
    lag_b = lag_by_group(partition_lag(kafka_bootstrap, b.topics))
    assert all(g.startswith(a.topics.prefix) for g in lag_a) and a.topics.group_id("extractor") in lag_a
    assert all(g.startswith(b.topics.prefix) for g in lag_b)
    assert all(v == 0 for lags in lag_b.values() for v in lags.values()), lag_b
    assert b.extractor.store.latest("demo/support") is None
    assert all(len(members) == 1 for members in groups_b.values())    # B's own grader / extractor only
