"""Property-based fuzzing of every consumed topic: garbled records written straight to Kafka (random bytes,
valid protobufs of another type with or without the type header, random instances of the right type,
realistic records with a NaN or infinity planted in a float field, truncated records).

Every record is signed by the principal the access table lets write its topic (tests/helpers/signing.py), as
that service would sign it: the signature check (shared/kafka/trust.py) lets it through, so what is fuzzed is
the decoding behind it (unsigned garbage would all be refused as "unsigned" before any decoding).

Property, per consumer (grader: interactions + feedback; extractor: graded; weights:
checkpoints): every record the shared validation refuses (`shared.contracts.validation.decode_record`) reaches the
dead-letter topic, with its key and a stage naming that consumer, and the consumer is still running
afterwards. Records the validation accepts may be processed or dead-lettered later; they must not stop
the consumer either. Inference pods only log a bad model-updates record (every pod reads every order,
so dead letters would be duplicated per pod): there the property is that the pod keeps serving.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contracts.events import UndecodableEvent, make_envelope
from shared.contracts.topic_access import writers_of
from shared.contracts.topics import Topics, contract_name
from shared.contracts.validation import TYPE_HEADER, decode_record
from shared.kafka.admin import ensure_topics
from shared.kafka.security import librdkafka_config
from shared.proto.apprentice.v1 import events_pb2, inference_pb2, inference_pb2_grpc
from tests.helpers.grader import GraderProcess, delete_namespace, feedback, grader_env, interaction
from tests.helpers.kafka import TopicReader
from tests.helpers.signing import signer
from tests.helpers.waiting import wait_for
from tests.security.harness import SECURITY_VARS, SERVING, health
from tests.security.strategies import messages
from tests.unit.extractor.factories import graded as graded_record

pytestmark = pytest.mark.integration
EXAMPLES = max(3, int(os.environ.get("APPRENTICE_FUZZ_EXAMPLES", "30")) // 4)
"""Batches per topic: each waits for its dead letters, so a quarter of the RPC fuzzer's budget."""
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
E = events_pb2
MAX_VALUE = 990_000
"""Largest record value written (librdkafka and the broker refuse records over 1,000,000 bytes, overhead included)."""
EVENT_TYPES = (E.Interaction, E.FeedbackEvent, E.GradedInteraction, E.KnowledgeSnapshot, E.CheckpointPublished,
               E.ModelUpdate, E.DeadLetter, E.AuditRecord)
GRADER_CONFIG = """
version: fuzz-1
tasks:
  - tenant: "*"
    task: support
    feedback_window_s: 2
    graders:
      - {name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}
      - {name: stars, type: feedback, kind: rating}
"""


# --- records ---------------------------------------------------------------------------------------
def _checkpoint() -> E.CheckpointPublished:
    return E.CheckpointPublished(envelope=make_envelope("acme", source="fuzz"), model="tiny-random",
                                 version=f"v{uuid.uuid4().int % 1000 + 1}", kind="full", algorithm="grpo",
                                 metrics={"loss": 0.5}, tenant="acme")


def _model_update() -> E.ModelUpdate:
    return E.ModelUpdate(envelope=make_envelope("acme", source="fuzz"), model="tiny-random", version="v1",
                         action=E.UPDATE_ACTION_PROMOTE)


REALISTIC: dict[type[Message], Callable[[], Message]] = {
    E.Interaction: lambda: interaction(tenant="acme"),
    E.FeedbackEvent: lambda: feedback(str(uuid.uuid4()), kind="rating", value=4.0, tenant="acme",
                                      occurred_at=datetime.now(UTC)),
    E.GradedInteraction: lambda: graded_record(session=f"s-{uuid.uuid4().hex[:6]}", iid=str(uuid.uuid4()),
                                               correction="The warranty lasts 24 months."),
    E.CheckpointPublished: _checkpoint,
    E.ModelUpdate: _model_update,
}


def _float_slots(msg: Message, depth: int = 0) -> list[tuple[Message, FieldDescriptor]]:
    """(message, field) pairs holding floats, in `msg` and the messages set inside it."""
    out: list[tuple[Message, FieldDescriptor]] = []
    floats = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
    for fd in msg.DESCRIPTOR.fields:
        if fd.type in floats or (fd.message_type is not None and fd.message_type.GetOptions().map_entry
                                 and fd.message_type.fields_by_name["value"].type in floats):
            out.append((msg, fd))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE and not fd.is_repeated and depth < 2 and msg.HasField(fd.name):
            out.extend(_float_slots(getattr(msg, fd.name), depth + 1))
    return out


def _poisoned(msg: Message, slot: int, value: float) -> Message:
    slots = _float_slots(msg)
    if not slots:
        return msg
    target, fd = slots[slot % len(slots)]
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        getattr(target, fd.name)["planted"] = value
    elif fd.is_repeated:
        getattr(target, fd.name).append(value)
    else:
        setattr(target, fd.name, value)
    return msg


Headers = list[tuple[str, str | bytes | None]] | None


def _header(t: type[Message]) -> Headers:
    return [(TYPE_HEADER, t.DESCRIPTOR.full_name.encode())]


def records(msg_type: type[Message]) -> st.SearchStrategy[tuple[bytes, Headers]]:
    """Garbled records for a topic whose values are `msg_type`."""
    others = [t for t in EVENT_TYPES if t is not msg_type]
    realistic = st.builds(REALISTIC[msg_type])
    wrong_type = st.sampled_from(others).flatmap(lambda t: st.tuples(messages(t), st.booleans()).map(
        lambda mh: (mh[0].SerializeToString(), _header(type(mh[0])) if mh[1] else None)))
    return st.one_of(
        st.binary(max_size=300).map(lambda b: (b, None)),
        st.sampled_from([b"", b"\x00", b"\xff" * 16, b"\x0a\x05abc"]).map(lambda b: (b, _header(msg_type))),
        wrong_type,
        st.sampled_from(others).flatmap(lambda t: st.builds(REALISTIC.get(t, _checkpoint)).map(
            lambda m: (m.SerializeToString(), None))),                       # a real record of another topic
        messages(msg_type).map(lambda m: (m.SerializeToString(), _header(msg_type))),
        st.builds(_poisoned, realistic, st.integers(0, 50),
                  st.sampled_from([math.nan, math.inf, -math.inf])).map(lambda m: (m.SerializeToString(),
                                                                                    _header(msg_type))),
        st.builds(lambda m, cut: m.SerializeToString()[:cut], realistic, st.integers(1, 40)).map(
            lambda b: (b, _header(msg_type))),
    )


def refused(msg_type: type[Message], value: bytes, headers: Headers) -> bool:
    """The oracle: does the shared validation refuse this record?"""
    try:
        decode_record(msg_type, value, headers)
    except UndecodableEvent:
        return True
    return False


# --- the consumers ---------------------------------------------------------------------------------
@dataclass
class Target:
    topic: str
    msg_type: type[Message]
    stage_prefix: str
    alive: Callable[[], bool]


class Namespace:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.topics = Topics(prefix=f"test-fuzz-{uuid.uuid4().hex[:8]}.")
        ensure_topics(bootstrap, self.topics)
        self.producer = Producer({**librdkafka_config(), "bootstrap.servers": bootstrap})
        self.dead = TopicReader(bootstrap, self.topics.deadletter)

    def produce(self, topic: str, key: str, value: bytes, headers: Headers) -> Headers:
        """Write the record signed by the topic's writer (the first the access table names); the headers
        as written (the signer's, plus the record's own, a None value written as empty)."""
        base = contract_name(topic)
        assert base is not None, topic
        sent: Headers = [*signer(sorted(writers_of(base))[0]).headers(base, key.encode(), value, headers)]
        try:
            self.producer.produce(topic, value=value, key=key.encode(), headers=sent)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            # a value over Kafka's record limit is refused before any topic: no consumer can ever read it
        return sent

    def letters(self, keys: set[bytes], timeout: float) -> dict[bytes, E.DeadLetter]:
        self.dead.wait_for(lambda ds: keys <= {d.original_key for d in ds}, timeout,
                           parse=E.DeadLetter.FromString)
        found = (E.DeadLetter.FromString(m.value()) for m in self.dead.records)
        return {d.original_key: d for d in found if d.original_key in keys}

    def close(self) -> None:
        self.producer.flush(10)
        self.dead.close()
        delete_namespace(self.bootstrap, self.topics.prefix)


@pytest.fixture(scope="module")
def plain_env() -> Iterator[None]:
    """Kafka consumers need no gRPC keys: run them as a developer's machine does."""
    with pytest.MonkeyPatch.context() as mp:
        for name in SECURITY_VARS:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str, plain_env: None) -> Iterator[Namespace]:
    n = Namespace(kafka_bootstrap)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("APPRENTICE_TOPIC_PREFIX", n.topics.prefix)
        mp.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
        yield n
    n.close()


@dataclass
class Grader:
    proc: GraderProcess
    ns: Namespace


@pytest.fixture(scope="module")
def grader(kafka_bootstrap: str, plain_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    """A grader process in its own namespace."""
    g_ns = Namespace(kafka_bootstrap)
    home = tmp_path_factory.mktemp("grader")
    (home / "grader.yaml").write_text(GRADER_CONFIG)
    env = {**grader_env(g_ns.topics.prefix, kafka_bootstrap, home / "grader.yaml", home),
           "APPRENTICE_INTERACTION_ID_SECRET": ""}
    proc = GraderProcess(env, home / "grader.log").start()
    try:
        # ready once it dead-letters a first bad record (a faust worker takes a while to join its group)
        key = f"ready-{uuid.uuid4().hex}"
        g_ns.produce(g_ns.topics.interactions, key, b"\xff", None)
        g_ns.producer.flush(10)
        got = g_ns.letters({key.encode()}, timeout=180)
        assert got, f"the grader never dead-lettered a first record:\n{proc.log_tail()}"
        yield Grader(proc, g_ns)
    finally:
        proc.stop()
        g_ns.close()


@pytest.fixture(scope="module")
def extractor(ns: Namespace, tiny_model_name: str) -> Iterator[Any]:
    from tests.security.harness import start_knowledge

    app = start_knowledge(tiny_model_name, consume=True)
    yield app
    app.stop()


@pytest.fixture(scope="module")
def weights(ns: Namespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from services.weights.service import start
    from services.weights.settings import LocalStoreSettings, WeightsSettings

    running = start(WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, policy="manual", grace_s=1.0,
                                    store=LocalStoreSettings(dir=tmp_path_factory.mktemp("store")),
                                    consumer_group=f"weights-fuzz-{uuid.uuid4().hex[:6]}"), consume=True)
    yield running
    running.stop(grace=1.0)


def _fuzz(ns: Namespace, target: Target, data: st.DataObject, what: str, log: Callable[[], str] = str) -> None:
    batch = data.draw(st.lists(records(target.msg_type), min_size=1, max_size=6), label="records")
    batch = [r for r in batch if len(r[0]) <= MAX_VALUE]   # the broker itself refuses larger ones
    must_dead_letter: set[bytes] = set()
    for value, headers in batch:
        key = f"fuzz-{uuid.uuid4().hex}"
        sent = ns.produce(target.topic, key, value, headers)
        if refused(target.msg_type, value, sent):
            must_dead_letter.add(key.encode())
    ns.producer.flush(30)
    letters = ns.letters(must_dead_letter, timeout=60)
    missing = must_dead_letter - set(letters)
    assert not missing, f"{what}: {len(missing)} refused records were not dead-lettered\n{log()}"
    for letter in letters.values():
        assert letter.stage.startswith(target.stage_prefix) and letter.reason, letter.stage
        assert letter.origin_topic == target.topic
    assert target.alive(), f"{what} stopped consuming"


@pytest.mark.parametrize("topic", ["interactions", "feedback"])
def test_the_grader_dead_letters_garbage(topic: str, grader: Grader) -> None:
    msg_type = E.Interaction if topic == "interactions" else E.FeedbackEvent
    target = Target(getattr(grader.ns.topics, topic), msg_type, "grader", grader.proc.alive)

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _fuzz(grader.ns, target, data, f"grader on {topic}", grader.proc.log_tail)

    run()


def test_the_extractor_dead_letters_garbage(ns: Namespace, extractor: Any) -> None:
    target = Target(ns.topics.graded, E.GradedInteraction, "extractor",
                    lambda: extractor._thread is not None and extractor._thread.is_alive())

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _fuzz(ns, target, data, "extractor on graded")

    run()


def test_the_weights_service_dead_letters_garbage(ns: Namespace, weights: Any) -> None:
    def alive() -> bool:
        return all(t.is_alive() for t in weights.service._threads)

    target = Target(ns.topics.checkpoints, E.CheckpointPublished, "weights", alive)

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _fuzz(ns, target, data, "weights on checkpoints")

    run()


def test_inference_pods_keep_serving_through_garbage_orders(ns: Namespace, tiny_model_name: str,
                                                             tmp_path: Path) -> None:
    from tests.helpers.inference import start_inference

    app = start_inference(tmp_path, model=tiny_model_name, bootstrap=ns.bootstrap, topic_prefix=ns.topics.prefix,
                          follow_updates=True, heartbeat_interval_s=0, http_port=0)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{app.port}")
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert _produce_examples(ns, ns.topics.model_updates, records(E.ModelUpdate), n=EXAMPLES * 3)
        follower = app.follower
        assert follower is not None
        wait_for(lambda: follower._thread.is_alive() and follower.caught_up.is_set(), what="the follower", stall_s=30)
        assert health(channel) == SERVING
        r = stub.Generate(inference_pb2.GenerateRequest(prompt="still there?", tenant="acme",
                                                        sampling={"max_new_tokens": 2}), timeout=60)
        assert r.policy_version == "base" and follower._thread.is_alive()
        channel.close()
    finally:
        app.stop(2)


def _produce_examples(ns: Namespace, topic: str, strategy: st.SearchStrategy[tuple[bytes, Headers]], n: int) -> int:
    """Write `n` records drawn from `strategy` (hypothesis drives the draws)."""
    sent: list[int] = []

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(rec=strategy)
    def produce(rec: tuple[bytes, Headers]) -> None:
        ns.produce(topic, f"fuzz-{uuid.uuid4().hex}", rec[0], rec[1])
        sent.append(1)

    produce()
    ns.producer.flush(30)
    return len(sent)


def test_refused_records_as_large_as_the_broker_allows_are_dead_lettered(ns: Namespace, extractor: Any,
                                                                         weights: Any) -> None:
    """Found by this file: the shared dead-letter publisher wrapped the whole refused value in the letter,
    so a refused record near the broker's size limit made a letter the broker refused in turn, and the
    consumer retried that record forever. Letters now keep at most `VALUE_MAX` bytes of it."""
    from shared.kafka.deadletter import VALUE_MAX

    BIG = 999_700   # fits in a record; with a letter's envelope, stage and reason around it, it did not
    keys = set()
    for topic in (ns.topics.graded, ns.topics.checkpoints):
        key = f"big-{uuid.uuid4().hex}"
        ns.produce(topic, key, b"\x0a" + b"\xff" * (BIG - 1), _header(E.Interaction))   # wrong type
        keys.add(key.encode())
    ns.producer.flush(30)
    letters = ns.letters(keys, timeout=60)
    assert set(letters) == keys
    for letter in letters.values():
        assert len(letter.original_value) == VALUE_MAX and f"cut from {BIG}" in letter.reason
    for key in ("after-1", "after-2"):   # and the consumers went on past it
        ns.produce(ns.topics.graded, key, b"\xff", None)
    ns.producer.flush(30)
    assert set(ns.letters({b"after-1", b"after-2"}, timeout=60)) == {b"after-1", b"after-2"}
