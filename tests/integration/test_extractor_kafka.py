"""The extractor on the real broker: snapshot versions on the compacted topic, rebuild after a restart,
idempotence on redelivery, offsets committed only after the snapshot is durable, dead letters.

The extractor LLM is the real tiny random model in-process (its output is garbage the parser must survive);
the items come from the corrections, which makes the expected bases exact.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from services.extractor.curation import approx_tokens
from services.extractor.llm_local import LocalLLM
from services.extractor.service import ExtractorApp
from services.extractor.settings import ExtractorSettings
from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.kafka import EventProducer
from shared.kafka.security import librdkafka_config
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer
from tests.unit.extractor.factories import graded

pytestmark = pytest.mark.integration
KEY = "acme/support"


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_name: str) -> LocalLLM:
    llm = LocalLLM(tiny_model_name)
    llm._load()
    return llm


def _latest(app: ExtractorApp) -> events_pb2.KnowledgeSnapshot:
    snap = app.store.latest(KEY)
    assert snap is not None
    return snap


def make_app(llm: LocalLLM, group: str, **overrides: Any) -> ExtractorApp:
    kw: dict[str, Any] = dict(port=0, metrics_port=0, group_id=group, session_gap_s=0.0, max_new_tokens=24,
                                 rate_limit_per_s=100, rate_burst=100)
    settings = ExtractorSettings(**{**kw, **overrides})
    return ExtractorApp(settings, llm, count_tokens=approx_tokens)


def produce(bootstrap: str, topic: str, records: list[events_pb2.GradedInteraction | bytes], key: str = "") -> None:
    p = signed_producer(bootstrap, "grader")   # graded records are the grader's
    for r in records:
        p.produce(topic, key or (r.interaction.session_id if not isinstance(r, bytes) else "junk"), r)
    p.flush()


def drive(app: ExtractorApp, until: Callable[[], bool], timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.poll_once()
        if until():
            return
    raise AssertionError("condition not reached in time")


def snapshots(bootstrap: str, topics: Topics) -> list[events_pb2.KnowledgeSnapshot]:
    return [decode(events_pb2.KnowledgeSnapshot, m.value()) for m in read_all(bootstrap, topics.knowledge, idle=1.0, timeout=10)]


def committed(bootstrap: str, group: str, topic: str, partitions: int = 6) -> dict[int, int]:
    c = Consumer({**librdkafka_config(), "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
    finally:
        c.close()


def ends(bootstrap: str, topic: str, partitions: int = 6) -> dict[int, int]:
    c = Consumer({**librdkafka_config(), "bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4()}"})
    try:
        out = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        return {p: hi for p, hi in out.items() if hi > 0}
    finally:
        c.close()


def test_versions_rebuild_and_idempotent_redelivery(topics: Topics, kafka_bootstrap: str, tiny_llm: LocalLLM) -> None:
    group = f"extractor-{uuid.uuid4().hex[:6]}"
    app = make_app(tiny_llm, group)
    assert app.rebuild() == 0
    produce(kafka_bootstrap, topics.graded, [
        graded(session="s1", iid="i1", correction="The warranty lasts 24 months."),
        graded(session="s2", iid="i2", question="How do I return an item?", correction="Use form R-12 within 30 days."),
    ])
    drive(app, lambda: (s := app.store.latest(KEY)) is not None and len(s.items) >= 2)
    on_topic = snapshots(kafka_bootstrap, topics)
    assert [s.version for s in on_topic] == list(range(1, len(on_topic) + 1))     # 1, 2, ... per change
    last = on_topic[-1]
    assert last == app.store.latest(KEY)
    prov = {it.text: list(it.source_interaction_ids) for it in last.items if it.created_by == "correction"}
    assert prov == {"The warranty lasts 24 months.": ["i1"], "Use form R-12 within 30 days.": ["i2"]}
    questions = {it.text: list(it.questions) for it in last.items if it.created_by == "correction"}
    assert questions["Use form R-12 within 30 days."] == ["How do I return an item?"]
    assert all(it.status == events_pb2.ITEM_STATUS_PROPOSED for it in last.items)   # reviewed by default
    assert {(p.interaction_id, p.revision) for p in last.processed} == {("i1", 1), ("i2", 1)}
    assert committed(kafka_bootstrap, topics.group_id(group), topics.graded) == ends(kafka_bootstrap, topics.graded)
    app.stop()

    # restart: the new process rebuilds the base from the compacted topic and continues the numbering
    app2 = make_app(tiny_llm, group)
    assert app2.rebuild() == len(on_topic)
    assert app2.store.latest(KEY) == last
    produce(kafka_bootstrap, topics.graded, [graded(session="s3", iid="i3", question="Billing?",
                                                    correction="Billing questions go to extension 4417.")])
    drive(app2, lambda: _latest(app2).version > last.version)
    after = snapshots(kafka_bootstrap, topics)
    assert after[-1].version == last.version + 1 and len(after[-1].items) == len(last.items) + 1
    app2.stop()

    # redelivery: a consumer group that has committed nothing reads every graded record again -> no change
    app3 = make_app(tiny_llm, f"{group}-replay")
    app3.rebuild()
    drive(app3, lambda: committed(kafka_bootstrap, topics.group_id(f"{group}-replay"), topics.graded) == ends(kafka_bootstrap, topics.graded))
    assert snapshots(kafka_bootstrap, topics) == after
    # a higher revision of an applied interaction (late feedback) is new information
    produce(kafka_bootstrap, topics.graded, [graded(session="s1", iid="i1", revision=2, success=True, reward=1.0,
                                                    correction="Warranty: 24 months, batteries 6 months.")])
    drive(app3, lambda: _latest(app3).version == after[-1].version + 1)
    assert ("i1", 2) in {(p.interaction_id, p.revision) for p in _latest(app3).processed}
    app3.stop()


def test_offsets_wait_for_open_sessions_and_poison_goes_to_dead_letters(topics: Topics, kafka_bootstrap: str,
                                                                         tiny_llm: LocalLLM) -> None:
    group = f"extractor-{uuid.uuid4().hex[:6]}"
    app = make_app(tiny_llm, group, session_gap_s=3600.0)
    app.rebuild()
    produce(kafka_bootstrap, topics.graded, [graded(session="long", iid="x1", correction="Say 24 months.")], key="long")
    produce(kafka_bootstrap, topics.graded, [b"\x08\x96\x01 not a graded interaction"], key="long")  # same partition
    drive(app, lambda: len(app.buffer) == 1 and app.deadletters.count == 1)
    # the session is open (no snapshot yet): nothing may be committed past its record (offset 0); the
    # poison record behind it (offset 1) is dead-lettered but must wait too
    [(part, end)] = ends(kafka_bootstrap, topics.graded).items()
    assert end == 2 and committed(kafka_bootstrap, topics.group_id(group), topics.graded).get(part, 0) == 0
    assert app.store.latest(KEY) is None
    [dl] = [decode(events_pb2.DeadLetter, m.value()) for m in read_all(kafka_bootstrap, topics.deadletter, expect=1)]
    assert dl.stage == "extractor.decode" and dl.origin_topic == topics.graded
    # the session closes (shutdown flush) -> snapshot durable -> then the offsets move past both records
    assert app.process_ready(flush_all=True) == 1
    app._commit()
    assert snapshots(kafka_bootstrap, topics)[-1].version == 1
    assert committed(kafka_bootstrap, topics.group_id(group), topics.graded) == ends(kafka_bootstrap, topics.graded)
    app.stop()


def test_forged_model_updates_are_dead_lettered_not_consolidated(topics: Topics, kafka_bootstrap: str,
                                                                  tiny_llm: LocalLLM) -> None:
    """A promotion order not written by the weights service (unsigned, or signed by the trainer) would
    move acme's items out of the serving context; the consolidation follower dead-letters it instead."""
    from services.extractor.consolidation import ConsolidationFollower
    from shared.contracts.events import make_envelope
    from shared.kafka.trust import RecordTrust
    from shared.settings import CommonSettings

    app = make_app(tiny_llm, f"extractor-{uuid.uuid4().hex[:6]}")
    order = events_pb2.ModelUpdate(envelope=make_envelope("acme", source="weights"), model="tiny-random",
                                   version="v9", tenant="acme", action=events_pb2.UPDATE_ACTION_PROMOTE)
    for p in (EventProducer(kafka_bootstrap, client_id="attacker"), signed_producer(kafka_bootstrap, "trainer")):
        p.produce(topics.model_updates, "tiny-random", order)
        p.flush()
    follower = ConsolidationFollower(app.store, kafka_bootstrap, topics.model_updates,
                                     topics.group_id(f"consolidation-{uuid.uuid4().hex[:6]}"),
                                     None,   # never called: no order is trusted
                                     trust=RecordTrust.from_settings(CommonSettings(), monotonic=True),
                                     deadletters=app.deadletters).start()
    try:
        deadline = time.monotonic() + 30
        while follower.refused < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        follower.stop()
        app.stop()
    assert (follower.refused, follower.applied) == (2, 0)
    dead = [decode(events_pb2.DeadLetter, m.value()) for m in read_all(kafka_bootstrap, topics.deadletter, expect=2)]
    for d in dead:
        print(f"dead letter: stage={d.stage} reason={d.reason}")
    assert sorted((d.stage, d.reason) for d in dead) == [
        ("extractor.consolidation", "untrusted record: signer trainer may not write apprentice.model-updates.v1"),
        ("extractor.consolidation", "untrusted record: unsigned")]
