"""Attacks on the broker itself, by a process on the same host that reaches its port (SECURITY.md §4):

- a client without credentials cannot produce nor consume (the broker has no plain listener; its one
  listener requires SASL);
- a client with another service's credentials is refused what the access table does not grant it:
  `trainer` producing graded records, `analytics` producing anything, `inference` reading graded records,
  a principal joining another principal's consumer group;
- each principal can do exactly what shared/contracts/topic_access.py grants: for every principal and
  every topic of a deployment, a produce succeeds iff it is a writer and a read succeeds iff it is a reader.

Against the session's broker (tests/conftest.py `kafka_bootstrap`: the local broker with its authorizer,
this process holding the admin credentials), in a fresh topic namespace whose ACLs are applied from the
table (tools/broker/acls.py), as `apprentice kafka start` applies them for its own prefix. On the broker
configuration from before authorization (one plain listener, no authorizer) every one of these fails:
the anonymous client writes and reads, and so does every principal.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka.admin import admin, broker_answers, delete_topics, ensure_topics
from shared.kafka.consumers import new_consumer
from shared.kafka.reader import read_topic_to_end
from shared.kafka.security import PLAINTEXT, KafkaSecurity, librdkafka_config
from tools.broker.acls import apply_acls, grants
from tools.broker.local_broker import local_credentials_dir, principal_security

pytestmark = pytest.mark.integration

WAIT_S = 6.0
"""How long a refused client is given to (fail to) deliver or read: well past a SCRAM round trip and an
authorization answer, which come back in milliseconds."""


@pytest.fixture(scope="module")
def sasl_dir(kafka_bootstrap: str) -> Path:
    d = local_credentials_dir(os.environ)
    assert d is not None, "the session's broker must hand this process the local broker's admin credentials"
    return d


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str, sasl_dir: Path) -> Iterator[Topics]:
    """A fresh namespace with the table's ACLs, and one record (written by admin) on partition 0 of each
    topic, for the readers to find."""
    t = Topics(prefix=f"acl-{uuid.uuid4().hex[:8]}.")
    su = principal_security(sasl_dir, access.ADMIN)
    ensure_topics(kafka_bootstrap, t, security=su)
    apply_acls(admin(kafka_bootstrap, security=su), grants(t))
    p = Producer({**librdkafka_config(su), "bootstrap.servers": kafka_bootstrap})
    for a in access.TABLE:
        p.produce(t.prefix + a.topic, b"seed", key=b"seed", partition=0)
    assert p.flush(30) == 0
    yield t
    delete_topics(kafka_bootstrap, [s.name for s in t.specs()], security=su)


def produce(bootstrap: str, security: KafkaSecurity, topic: str) -> KafkaError | None:
    """Produce one record; None when the broker acknowledged it, else the delivery error."""
    outcome: list[KafkaError | None] = []
    p = Producer({**librdkafka_config(security), "bootstrap.servers": bootstrap, "log_level": 0,
                  "message.timeout.ms": int(WAIT_S * 1000), "acks": "all"})
    p.produce(topic, b"attempt", key=security.username.encode() if security.username else b"anon",
              on_delivery=lambda err, _msg: outcome.append(err))
    p.flush(WAIT_S + 5)
    assert outcome, "no delivery report within the message timeout"
    return outcome[0]


def read_seed(bootstrap: str, security: KafkaSecurity, topic: str, group: str) -> bytes | KafkaError | None:
    """Read partition 0 from its start (assigned, committing nothing): the seed record's value, or the
    error the broker answered, or None when nothing came within WAIT_S. (Compare the result with
    `isinstance` first: a KafkaError compared with bytes leaves a pending TypeError behind in the C
    extension, which surfaces at the next unrelated call.)"""
    c = Consumer({**librdkafka_config(security), "bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 0})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                return err
            return m.value()
        return None
    finally:
        c.close()


def written_by(bootstrap: str, sasl_dir: Path, topic: str, key: bytes) -> int:
    """Records on `topic` with `key`, as admin sees them (what an attempt really left on the broker)."""
    su = principal_security(sasl_dir, access.ADMIN)
    return sum(1 for m in read_topic_to_end(bootstrap, topic, purpose="acl-check", security=su, timeout_s=30)
               if m.key() == key)


def own_group(ns: Topics, principal: str) -> str:
    return ns.group_id(access.GROUP_PREFIXES[principal][0] + uuid.uuid4().hex[:8])


# --- no credentials --------------------------------------------------------------------------------
def test_no_plaintext_listener(kafka_bootstrap: str) -> None:
    """The bootstrap port speaks SASL only: a client without credentials gets no metadata at all."""
    assert not broker_answers(kafka_bootstrap, timeout=WAIT_S, security=PLAINTEXT)


def test_anonymous_client_cannot_produce_nor_consume(kafka_bootstrap: str, ns: Topics, sasl_dir: Path) -> None:
    err = produce(kafka_bootstrap, PLAINTEXT, ns.interactions)
    assert err is not None
    assert written_by(kafka_bootstrap, sasl_dir, ns.interactions, b"anon") == 0
    got = read_seed(kafka_bootstrap, PLAINTEXT, ns.graded, f"anon-{uuid.uuid4().hex[:6]}")
    assert not isinstance(got, bytes)


def test_wrong_password_is_refused(kafka_bootstrap: str, ns: Topics, sasl_dir: Path) -> None:
    forged = KafkaSecurity(protocol="SASL_PLAINTEXT", mechanism="SCRAM-SHA-512", username=access.GRADER,
                           password="not-the-password")
    assert produce(kafka_bootstrap, forged, ns.graded) is not None
    assert written_by(kafka_bootstrap, sasl_dir, ns.graded, access.GRADER.encode()) == 0


# --- another service's credentials -----------------------------------------------------------------
def test_trainer_cannot_write_graded_records(kafka_bootstrap: str, ns: Topics, sasl_dir: Path) -> None:
    err = produce(kafka_bootstrap, principal_security(sasl_dir, access.TRAINER), ns.graded)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert written_by(kafka_bootstrap, sasl_dir, ns.graded, access.TRAINER.encode()) == 0


def test_analytics_cannot_write_anything(kafka_bootstrap: str, ns: Topics, sasl_dir: Path) -> None:
    sec = principal_security(sasl_dir, access.ANALYTICS)
    for a in access.TABLE:
        err = produce(kafka_bootstrap, sec, ns.prefix + a.topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, a.topic


def test_inference_cannot_read_graded_records(kafka_bootstrap: str, ns: Topics, sasl_dir: Path) -> None:
    got = read_seed(kafka_bootstrap, principal_security(sasl_dir, access.INFERENCE), ns.graded,
                    own_group(ns, access.INFERENCE))
    assert isinstance(got, KafkaError) and got.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_joining_another_principals_group_is_refused(kafka_bootstrap: str, ns: Topics, sasl_dir: Path) -> None:
    """`extractor` may read graded records, but not as the trainer's group (its committed offsets would
    move the trainer's position): the join is refused, nothing is read."""
    trainer_group = ns.group_id(f"apprentice-trainer-{uuid.uuid4().hex[:6]}")
    c = new_consumer(kafka_bootstrap, purpose="acl-test", group_id=trainer_group, log_level=0,
                     security=principal_security(sasl_dir, access.EXTRACTOR))
    errors: list[int] = []
    try:
        c.subscribe([ns.graded])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not errors:
            m = c.poll(0.5)
            if m is not None:
                err = m.error()
                assert err is not None, "a record was read through another principal's group"
                errors.append(err.code())
    finally:
        c.close()
    assert errors == [KafkaError.GROUP_AUTHORIZATION_FAILED]


# --- exactly the table -----------------------------------------------------------------------------
@pytest.mark.parametrize("principal", access.PRINCIPALS)
def test_each_principal_can_do_exactly_what_the_table_grants(kafka_bootstrap: str, ns: Topics, sasl_dir: Path,
                                                             principal: str) -> None:
    sec = principal_security(sasl_dir, principal)
    group = own_group(ns, principal)
    wrong: list[str] = []
    for a in access.TABLE:
        topic = ns.prefix + a.topic
        wrote = produce(kafka_bootstrap, sec, topic) is None
        if wrote != (principal in a.writers):
            wrong.append(f"{'wrote' if wrote else 'could not write'} {a.topic}")
        got = read_seed(kafka_bootstrap, sec, topic, group)
        read = isinstance(got, bytes) and got == b"seed"
        if read != (principal in a.readers):
            wrong.append(f"{'read' if read else 'could not read'} {a.topic}")
    assert not wrong, f"{principal}: " + "; ".join(wrong)
