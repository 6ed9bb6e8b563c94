"""Attacks on the grader through Kafka, replayed against the real broker and a real grader process: each
must now end in the dead-letter topic, with the stage and reason, while everything else
is still graded.

- tenant B's correction on tenant A's interaction id was joined into A's graded record;
- 70 corrections of 20,000 characters on one interaction made a state over Kafka's 1 MB limit: the
  grader retried it forever, graded nothing for anyone (also after a restart) and ignored SIGTERM;
- feedback dated long before its interaction, or in the future;
- a FeedbackEvent written to the interactions topic was graded as an interaction; a NaN rating written
  straight to Kafka became the maximum reward;
- a second interaction under an id already in use, from another producer, raced the first;
- forged interaction ids (the MAC shared with inference does not verify for the record's tenant);
- a record the broker refuses (here: a graded record over the topic's limit) stopped the grader;
- SIGTERM while Kafka writes keep failing;
- records whose writer cannot be trusted (shared/kafka/trust.py): an interaction signed by the trainer,
  unsigned feedback, a signed feedback re-sent at another offset, a rule record signed by nobody (or by
  a principal other than the operator).
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from shared.contracts.topics import FEEDBACK, GRADER_RULES, INTERACTIONS, Topics
from shared.contracts.validation import TYPE_HEADER, KafkaHeaders, type_headers
from shared.kafka.admin import admin, ensure_topics, list_topics
from shared.kafka.security import librdkafka_config
from shared.kafka.signing import RecordSigner
from shared.proto.apprentice.v1 import events_pb2
from shared.security.interaction_ids import issue
from tests.helpers.grader import (
    GraderProcess,
    by_interaction,
    delete_namespace,
    feedback,
    graded,
    grader_env,
    interaction,
)
from tests.helpers.kafka import TopicReader
from tests.helpers.signing import signed_producer, signer
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.integration

TENANT_A, TENANT_B = "acme", "globex"
CONFIG = """
version: attacks-1
tasks:
  - tenant: "*"
    task: support
    feedback_window_s: 120
    graders:
      - {name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}
      - {name: corrected, type: feedback, kind: correction, weight: 0}
  - tenant: "*"
    task: rating
    feedback_window_s: 3
    graders:
      - {name: stars, type: feedback, kind: rating}
  - tenant: "*"
    task: rules
    graders:
      - {name: has_number, type: regex, pattern: "[0-9]+", success: true}
"""
NO_SECURITY = {"APPRENTICE_INTERACTION_ID_SECRET": ""}


class Grader:
    """One namespace, one grader process, readers of the graded and dead-letter topics."""

    def __init__(self, bootstrap: str, home: Path, *, graded_config: dict[str, str] | None = None,
                 secret: str = "", **extra: str) -> None:
        self.bootstrap, self.home = bootstrap, home
        self.topics = Topics(prefix=f"test-atk-{uuid.uuid4().hex[:8]}.")
        if graded_config:  # the graded topic with special limits, created before the others
            client = admin(bootstrap)  # kept alive until its future resolves
            client.create_topics([NewTopic(self.topics.graded, 6, 1, config=graded_config)])[self.topics.graded].result(30)
        ensure_topics(bootstrap, self.topics)
        cfg = home / "grader.yaml"
        cfg.write_text(CONFIG)
        self.env = {**grader_env(self.topics.prefix, bootstrap, cfg, home, **extra), **NO_SECURITY,
                    "APPRENTICE_INTERACTION_ID_SECRET": secret}
        self.starts = 0
        self.proc = self.start()
        self.producer = signed_producer(bootstrap, "inference", client_id="attacker")
        self.graded = TopicReader(bootstrap, self.topics.graded)
        self.dead = TopicReader(bootstrap, self.topics.deadletter)

    def start(self) -> GraderProcess:
        self.starts += 1
        return GraderProcess(self.env, self.home / f"grader-{self.starts}.log").start()

    def send(self, topic: str, key: str, value: events_pb2.Interaction | events_pb2.FeedbackEvent | bytes) -> None:
        self.producer.produce(topic, key, value)
        self.producer.flush()

    def interaction(self, it: events_pb2.Interaction) -> None:
        self.send(self.topics.interactions, it.session_id, it)

    def feedback(self, fb: events_pb2.FeedbackEvent) -> None:
        self.send(self.topics.feedback, fb.interaction_id, fb)

    def graded_for(self, iid: str, n: int = 1, timeout: float = 60.0) -> list[events_pb2.GradedInteraction]:
        recs = by_interaction(self.graded.wait_for(lambda rs: len(by_interaction(rs, iid)) >= n, timeout,
                                                   parse=graded), iid)
        assert len(recs) >= n, f"{iid}: {len(recs)} graded records, expected {n}\n{self.proc.log_tail()}"
        return recs

    def letters(self, pred, n: int = 1, timeout: float = 60.0) -> list[events_pb2.DeadLetter]:  # type: ignore[no-untyped-def]
        found = [d for d in self.dead.wait_for(lambda ds: sum(map(pred, ds)) >= n, timeout,
                                               parse=events_pb2.DeadLetter.FromString) if pred(d)]
        assert len(found) >= n, f"{len(found)} dead letters, expected {n}\n{self.proc.log_tail()}"
        return found

    def close(self) -> None:
        self.proc.stop()
        self.graded.close()
        self.dead.close()
        delete_namespace(self.bootstrap, self.topics.prefix)


@pytest.fixture(scope="module")
def grader(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    g = Grader(kafka_bootstrap, tmp_path_factory.mktemp("attacks"))
    try:
        yield g
    finally:
        g.close()


def letter_for(key: str, stage: str):  # type: ignore[no-untyped-def]
    return lambda d: d.original_key == key.encode() and d.stage == stage


def test_a_correction_from_another_tenant_is_dead_lettered_not_joined(grader: Grader) -> None:
    it = interaction(tenant=TENANT_A, task="support", text="The warranty is 24 months.")
    grader.interaction(it)
    stolen = feedback(it.interaction_id, kind="correction", tenant=TENANT_B, value=-1,
                      comment="Tell everyone the warranty is void.")
    grader.feedback(stolen)
    grader.feedback(feedback(it.interaction_id, tenant=TENANT_A, value=1.0))
    [rec] = grader.graded_for(it.interaction_id)
    assert [f.envelope.tenant for f in rec.feedback] == [TENANT_A]
    assert all("void" not in f.comment for f in rec.feedback)
    [dl] = grader.letters(letter_for(it.interaction_id, "grader.tenant"))
    assert dl.original_value == stolen.SerializeToString() and "another tenant" in dl.reason
    assert dl.envelope.tenant == TENANT_B


def test_a_flood_of_long_corrections_is_capped_and_everyone_is_still_graded(grader: Grader) -> None:
    it = interaction(tenant=TENANT_A, task="support")
    grader.interaction(it)
    for _ in range(70):
        grader.producer.produce(grader.topics.feedback, it.interaction_id,
                                feedback(it.interaction_id, kind="correction", tenant=TENANT_A, value=-1,
                                         comment="z" * 20_000))
    grader.feedback(feedback(it.interaction_id, tenant=TENANT_A, value=1.0))  # completes it: graded now
    other = interaction(tenant=TENANT_B, task="rules", text="7 days")
    grader.interaction(other)
    assert grader.graded_for(other.interaction_id)[0].has_signal
    refused = grader.letters(letter_for(it.interaction_id, "grader.limits"), n=64)
    assert len(refused) == 64 and all("MAX_FEEDBACK_BYTES" in d.reason for d in refused)
    [rec] = grader.graded_for(it.interaction_id)
    # 128 KiB of feedback per interaction: six corrections of ~20 kB, then the KPI
    assert [f.kind for f in rec.feedback] == ["correction"] * 6 + ["kpi"] and rec.reward == 1.0
    # and after a restart (the state of that interaction is read back from the changelog) it goes on
    start = time.monotonic()
    grader.proc.stop(timeout=30)
    assert time.monotonic() - start < 20, "SIGTERM took too long"
    grader.proc = grader.start()
    after = interaction(tenant=TENANT_B, task="rules", text="3 days")
    grader.interaction(after)
    assert grader.graded_for(after.interaction_id, timeout=90)[0].has_signal


def test_feedback_outside_the_clock_skew_is_dead_lettered(grader: Grader) -> None:
    now = datetime.now(UTC)
    it = interaction(tenant=TENANT_A, task="rating", occurred_at=now)
    grader.interaction(it)
    past = feedback(it.interaction_id, tenant=TENANT_A, kind="rating", value=5, occurred_at=now - timedelta(hours=2))
    future = feedback(it.interaction_id, tenant=TENANT_A, kind="rating", value=5, occurred_at=now + timedelta(hours=2))
    grader.feedback(past)
    grader.feedback(future)
    [rec] = grader.graded_for(it.interaction_id)  # window expired: neither joined
    assert not rec.feedback and not rec.has_signal
    letters = grader.letters(letter_for(it.interaction_id, "grader.time"), n=2)
    assert {d.original_value for d in letters} == {past.SerializeToString(), future.SerializeToString()}


def test_wrong_types_and_non_finite_values_are_dead_lettered_not_graded(grader: Grader) -> None:
    it = interaction(tenant=TENANT_A, task="rating")
    grader.interaction(it)
    nan = feedback(it.interaction_id, kind="rating", tenant=TENANT_A, value=float("nan"))
    grader.feedback(nan)
    # A valid FeedbackEvent on the interactions topic: with its type header (what our producer adds) ...
    disguised = feedback(it.interaction_id, kind="rating", tenant=TENANT_A, value=5)
    grader.send(grader.topics.interactions, "disguised-1", disguised)
    # ... and written raw by an outside producer without any header
    # (signed as inference: what is tested is the type check, not who wrote it)
    raw = Producer({**librdkafka_config(), "bootstrap.servers": grader.bootstrap})
    inference, value = signer("inference"), disguised.SerializeToString()
    raw.produce(grader.topics.interactions, value, b"disguised-2",
                headers=_signed(inference, INTERACTIONS, b"disguised-2", value))
    raw.produce(grader.topics.interactions, value, b"disguised-3",  # lying about its type
                headers=_signed(inference, INTERACTIONS, b"disguised-3", value,
                                          [(TYPE_HEADER, b"apprentice.v1.Interaction")]))
    raw.flush(30)
    [rec] = grader.graded_for(it.interaction_id)  # window over: the NaN rating never counted
    assert not rec.feedback and not rec.has_signal and rec.reward == 0.0
    [nan_dl] = grader.letters(letter_for(it.interaction_id, "grader.validate"))
    assert "nan" in nan_dl.reason
    for key in ("disguised-1", "disguised-2", "disguised-3"):
        [dl] = grader.letters(letter_for(key, "grader.validate"))
        assert dl.origin_topic == grader.topics.interactions
    graded_ids = {graded(m.value()).interaction.interaction_id for m in grader.graded.records}
    assert graded_ids.isdisjoint({"disguised-1", "disguised-2", "disguised-3"})


def test_an_interaction_id_already_used_by_another_producer_is_dead_lettered(grader: Grader) -> None:
    first = interaction(tenant=TENANT_A, task="rules", text="42 is the answer")
    first.envelope.source = "inference/pod-1"
    grader.interaction(first)
    grader.graded_for(first.interaction_id)
    replay = events_pb2.Interaction()
    replay.CopyFrom(first)
    replay.envelope.event_id = str(uuid.uuid4())  # the same producer after a crash: a duplicate, ignored
    rival = events_pb2.Interaction()
    rival.CopyFrom(first)
    rival.envelope.source, rival.response_text = "someone-else", "0 is the answer"
    rival.session_id = "rival-session"
    grader.interaction(replay)
    grader.interaction(rival)
    [dl] = grader.letters(lambda d: d.stage == "grader.producer" and d.original_value == rival.SerializeToString())
    assert "someone-else" in dl.reason
    grader.graded.poll(2.0)
    recs = by_interaction([graded(m.value()) for m in grader.graded.records], first.interaction_id)
    assert [r.interaction.response_text for r in recs] == ["42 is the answer"]


def test_forged_interaction_ids_are_dead_lettered(kafka_bootstrap: str, tmp_path: Path) -> None:
    """With the MAC secret shared with inference, an id must verify for the record's tenant: a Kafka writer
    cannot aim feedback at another tenant's interaction, nor invent ids."""
    secret = uuid.uuid4().hex
    g = Grader(kafka_bootstrap, tmp_path, secret=secret)
    try:
        good = issue(TENANT_A, secret.encode())
        it = interaction(tenant=TENANT_A, task="support", interaction_id=good)
        g.interaction(it)
        g.feedback(feedback(good, tenant=TENANT_B, kind="correction", comment="mine"))  # B aims at A's id
        forged = f"{uuid.uuid4().hex}.aaaaaaaaaaaaaaaaaaaaaaaaaa"
        g.feedback(feedback(forged, tenant=TENANT_A))
        g.interaction(interaction(tenant=TENANT_A, task="rules", text="1", interaction_id="unsigned-1"))
        g.feedback(feedback(good, tenant=TENANT_A, value=1.0))
        [rec] = g.graded_for(good)
        assert [f.envelope.tenant for f in rec.feedback] == [TENANT_A] and rec.reward == 1.0
        letters = g.letters(lambda d: d.stage == "grader.identity", n=3)
        assert {d.original_key for d in letters} >= {good.encode(), forged.encode()}
        assert all("does not verify" in d.reason for d in letters)
    finally:
        g.close()


def test_a_record_the_broker_refuses_is_dead_lettered_and_the_rest_is_graded(kafka_bootstrap: str,
                                                                           tmp_path: Path) -> None:
    """The graded topic takes records of at most 60 kB (an operator's topic limit below the grader's own):
    the graded record of a long answer is refused by the broker. Before, its batch failed for good; and
    every later graded record of that partition failed with OutOfOrderSequenceNumber (aiokafka kept the
    refused batch's sequence; services/grader/stream/patches.py, P2)."""
    g = Grader(kafka_bootstrap, tmp_path, graded_config={"max.message.bytes": "60000"}, batch_max="50")
    try:
        # random text: the topic limit applies to compressed batches
        # the same session: its graded record is refused on the partition the others are written to
        long = interaction(tenant=TENANT_A, task="rules", text=base64.b64encode(os.urandom(150_000)).decode(),
                           n_tokens=10, session_id="s-same")
        batch = [interaction(tenant=TENANT_A, task="rules", text=f"{i} days", session_id="s-same")
                 for i in range(20)]
        for it in batch[:10] + [long] + batch[10:]:
            g.producer.produce(g.topics.interactions, it.session_id, it)
        g.producer.flush()
        for it in batch:
            assert g.graded_for(it.interaction_id, timeout=120)[0].has_signal
        [dl] = g.letters(lambda d: d.stage == "grader.write", timeout=60)
        assert "refused" in dl.reason or "failed the same way" in dl.reason
        assert not by_interaction([graded(m.value()) for m in g.graded.records], long.interaction_id)
        later = interaction(tenant=TENANT_B, task="rules", text="5 days")
        g.interaction(later)
        assert g.graded_for(later.interaction_id)[0].has_signal
        assert g.proc.alive()
    finally:
        g.close()


def test_sigterm_stops_the_grader_promptly_while_kafka_writes_fail(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The graded topic needs 2 in-sync replicas on a 1-broker cluster: every graded write fails (and is
    retried by the client). A grader in that state must still stop within seconds on SIGTERM."""
    g = Grader(kafka_bootstrap, tmp_path, graded_config={"min.insync.replicas": "2"})
    changelog = f"{g.topics.prefix}apprentice-grader-pending-changelog"
    wait_for(lambda: changelog in list_topics(kafka_bootstrap), what="the grader's changelog topic (made at start)",
             stall_s=90, every=0.5)
    state = TopicReader(kafka_bootstrap, changelog, isolation="read_uncommitted")
    try:
        it = interaction(tenant=TENANT_A, task="rules", text="9 lives")
        g.interaction(it)
        # the batch is under way once its state is written
        assert state.wait_for(lambda rs: len(rs) >= 1, 90), g.proc.log_tail()
        assert g.proc.alive()
        start = time.monotonic()
        g.proc.stop(timeout=60)
        took = time.monotonic() - start
        assert took < 20, f"took {took:.1f}s to stop after SIGTERM\n{g.proc.log_tail()}"
    finally:
        state.close()
        g.close()


def test_every_record_names_its_type_in_a_header(grader: Grader) -> None:
    """What producers write (the shared EventProducer, and the grader's own graded records and dead letters)
    carries `apprentice-type`, so a consumer can refuse a record of another type."""
    it = interaction(tenant=TENANT_A, task="rules", text="1 answer")
    grader.interaction(it)
    grader.feedback(feedback(it.interaction_id, kind="rating", value=float("inf"), tenant=TENANT_A))
    grader.graded_for(it.interaction_id)
    grader.letters(letter_for(it.interaction_id, "grader.validate"))
    source = TopicReader(grader.bootstrap, grader.topics.interactions)
    try:
        [sent] = [m for m in source.wait_for(lambda ms: any(m.key() == it.session_id.encode() for m in ms), 30)
                  if m.key() == it.session_id.encode()]
    finally:
        source.close()
    out = next(m for m in grader.graded.records if graded(m.value()).interaction.interaction_id == it.interaction_id)
    dead = next(m for m in grader.dead.records if m.key() == it.interaction_id.encode())
    assert (TYPE_HEADER, b"apprentice.v1.Interaction") in (sent.headers() or [])
    assert (TYPE_HEADER, b"apprentice.v1.GradedInteraction") in (out.headers() or [])
    assert (TYPE_HEADER, b"apprentice.v1.DeadLetter") in (dead.headers() or [])
    # and the grader's own records carry its record signature (shared/kafka/signing.py)
    assert ("apprentice-signer", b"grader") in [(k, v.partition(b":")[0]) for k, v in out.headers() or []]
    assert ("apprentice-signer", b"grader") in [(k, v.partition(b":")[0]) for k, v in dead.headers() or []]


def test_records_from_untrusted_writers_are_dead_lettered_and_change_no_grade(grader: Grader) -> None:
    """Forged grade-influencing records: each lands in the dead-letter topic with its reason (stage
    `grader.trust`, or `grader.rules` for the rules topic) and no graded record reflects it."""
    raw = Producer({**librdkafka_config(), "bootstrap.servers": grader.bootstrap})
    inference, trainer = signer("inference"), signer("trainer")

    # an interaction written by the trainer (a compromised trainer cannot feed the grader)
    forged = interaction(tenant=TENANT_A, task="rules", text="42 forged")
    value, key = forged.SerializeToString(), forged.session_id.encode()
    raw.produce(grader.topics.interactions, value, key,
                headers=_signed(trainer, INTERACTIONS, key, value, type_headers(forged)))

    # a genuine interaction; unsigned feedback on it; one signed feedback, then the same record re-sent
    it = interaction(tenant=TENANT_A, task="rating")
    grader.interaction(it)
    unsigned = feedback(it.interaction_id, kind="rating", tenant=TENANT_A, value=1)
    raw.produce(grader.topics.feedback, unsigned.SerializeToString(), it.interaction_id.encode(),
                headers=type_headers(unsigned))
    good = feedback(it.interaction_id, kind="rating", tenant=TENANT_A, value=5)
    fb_value, fb_key = good.SerializeToString(), it.interaction_id.encode()
    signed = _signed(inference, FEEDBACK, fb_key, fb_value, type_headers(good))
    raw.produce(grader.topics.feedback, fb_value, fb_key, headers=signed)
    raw.flush(30)
    raw.produce(grader.topics.feedback, fb_value, fb_key, headers=signed)  # the replay, at a later offset

    reasons: list[str] = []
    [dl] = grader.letters(letter_for(forged.session_id, "grader.trust"))
    assert "signer trainer may not write apprentice.interactions.v1" in dl.reason, dl.reason
    reasons.append(dl.reason)
    trust_letters = grader.letters(letter_for(it.interaction_id, "grader.trust"), n=2)
    got = sorted(d.reason for d in trust_letters)
    assert any("unsigned" in r for r in got) and any("replay" in r for r in got), got
    reasons += got
    # (once the grader is live: records met while it catches up at start are only logged)
    # rule records for tenant A's `rules` task that would make every answer a success: unsigned, and
    # signed by inference (the value itself is a valid rule)
    rule = (b'{"tenant":"acme","task":"rules","revision":1,"operator":"mallory",'
            b'"rules":{"graders":[{"name":"any","type":"regex","pattern":".*","success":true}]}}')
    raw.produce(grader.topics.grader_rules, rule, b"acme/rules")
    raw.produce(grader.topics.grader_rules, rule, b"acme/rules",
                headers=_signed(inference, GRADER_RULES, b"acme/rules", rule))
    raw.flush(30)

    rule_letters = grader.letters(letter_for("acme/rules", "grader.rules"), n=2)
    got = sorted(d.reason for d in rule_letters)
    assert any("unsigned" in r for r in got), got
    assert any("signer inference may not write apprentice.grader-rules.v1" in r for r in got), got
    reasons += got
    print("dead letters' reasons:", *reasons, sep="\n  ")

    # graded output: the rating is the signed one, counted once; the forged interaction is never graded
    [rec] = grader.graded_for(it.interaction_id)
    assert [f.value for f in rec.feedback] == [5.0], rec.feedback
    # the rules were not applied: an answer without a number still fails the file's regex grader
    probe = interaction(tenant=TENANT_A, task="rules", text="no digits here")
    grader.interaction(probe)
    [graded_probe] = grader.graded_for(probe.interaction_id)
    assert not graded_probe.success and "+" not in graded_probe.grader_config_version
    graded_ids = {graded(m.value()).interaction.interaction_id for m in grader.graded.records}
    assert forged.interaction_id not in graded_ids


def _signed(by: RecordSigner, *args: Any) -> KafkaHeaders:
    """`by`'s signing headers (shared/kafka/signing.py `RecordSigner.headers`), typed as producers take them."""
    return [*by.headers(*args)]
