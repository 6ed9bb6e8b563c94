"""Kafka client security against a real, private broker (temp home, free ports; the session's broker is
never touched) started the way `apprentice kafka start` starts it: SASL only, with its authorizer.

- a data folder formatted and served by the configuration from before authorization (one plain
  listener, no authorizer, no users) keeps its records when this home's broker is restarted secured;
- with the client settings taken from the environment only (`APPRENTICE_KAFKA_SECURITY_PROTOCOL`,
  `..._SASL_USERNAME`, `..._SASL_PASSWORD_FILE`), as a deployment sets them, EventProducer /
  EventConsumer / the reader round-trip an event, each client as its own principal;
- a client without credentials, with a wrong password, or an unknown user is refused (bounded waits)
  and writes nothing;
- a broker on the port that refuses this home's admin is named, not silently reused;
- the stack runs through it: the inference service (as `inference`) captures a Generate and a Feedback,
  and the grader (as `grader`) joins and grades them.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from services.inference.client import InferenceClient
from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka import EventConsumer, EventProducer, ensure_topics
from shared.kafka.admin import admin, broker_answers, list_topics
from shared.kafka.reader import read_topic_to_end
from shared.kafka.security import PLAINTEXT, KafkaSecurity, librdkafka_config
from shared.proto.apprentice.v1 import events_pb2
from shared.settings import CommonSettings
from tests.helpers.grader import GraderProcess, by_interaction, graded, grader_env
from tests.helpers.inference import start_inference
from tests.helpers.kafka import TopicReader, link_broker_jars, read_all
from tests.helpers.ports import free_ports
from tools.broker.local_broker import BrokerError, LocalBroker

pytestmark = pytest.mark.integration

REFUSAL_WAIT_S = 6.0
"""How long a refused client is given to (fail to) connect and deliver: well past a SCRAM round trip."""


OLD_CONFIG = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data}
num.partitions=3
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
auto.create.topics.enable=true
"""
"""The local broker's configuration before authorization (tools/broker/local_broker.py's history)."""


def _start_old_config(b: LocalBroker) -> None:
    """Format and start `b`'s data folder with OLD_CONFIG, as this home's broker (its pid file)."""
    props = b.home / "server.properties"
    b.home.mkdir(parents=True, exist_ok=True)
    props.write_text(OLD_CONFIG.format(port=b.port, controller=b.controller_port, data=b.data.resolve()))
    b._format(props)
    b.log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(b.log_file, "ab") as log:
        proc = subprocess.Popen([b._need_java(), "-Xmx384m", "-cp", b._classpath(), "kafka.Kafka", str(props)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    b.pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + 90
    while not broker_answers(b.bootstrap, security=PLAINTEXT):
        assert time.monotonic() < deadline and proc.poll() is None, "the old-config broker did not start"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def old_record() -> dict[str, str]:
    return {"topic": f"legacy-{uuid.uuid4().hex[:6]}", "key": "from-before"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, old_record: dict[str, str]) -> Iterator[LocalBroker]:
    home = tmp_path_factory.mktemp("sasl-broker")
    link_broker_jars(home)            # reuse the shared broker's jars (else fetch_jars resolves them)
    port, controller = free_ports(2)
    b = LocalBroker(home, port=port, controller_port=controller)
    _start_old_config(b)                        # formatted and served without users, listener or authorizer
    p = Producer({"bootstrap.servers": b.bootstrap})
    p.produce(old_record["topic"], b"kept", key=old_record["key"].encode())
    assert p.flush(30) == 0
    try:
        st = b.start()                          # this home's, unsecured: restarted secured, same data
        assert st.owned and st.running and not st.foreign
        yield b
    finally:
        b.stop(timeout=10)


def test_an_old_plaintext_data_folder_keeps_its_records_after_the_secured_restart(
        broker: LocalBroker, old_record: dict[str, str]) -> None:
    assert not broker_answers(broker.bootstrap, timeout=REFUSAL_WAIT_S, security=PLAINTEXT)
    got = read_all(broker.bootstrap, old_record["topic"], expect=1, timeout=30,
                   security=broker.security(access.ADMIN))
    assert [(m.key(), m.value()) for m in got] == [(old_record["key"].encode(), b"kept")]


@pytest.fixture
def sasl_env(broker: LocalBroker, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Client settings of `inference`, in the environment only (password as a mounted file)."""
    env = broker.client_env(access.INFERENCE)
    monkeypatch.delenv("APPRENTICE_KAFKA_SASL_PASSWORD", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def ns(broker: LocalBroker, sasl_env: dict[str, str]) -> Iterator[Topics]:
    t = Topics(prefix=f"sasl-{uuid.uuid4().hex[:8]}.")
    su = broker.security(access.ADMIN)
    ensure_topics(broker.bootstrap, t, security=su)
    broker.ensure_access(t)
    yield t


def _refused(bootstrap: str, security: KafkaSecurity, topic: str) -> tuple[list[KafkaError], KafkaError | None]:
    """Try to write one record as `security`; return the client errors and the delivery error."""
    errors: list[KafkaError] = []
    delivery: list[KafkaError | None] = []
    p = EventProducer(bootstrap, client_id="intruder", security=security,
                      extra_config={"error_cb": errors.append, "log_level": 0,
                                    "message.timeout.ms": int(REFUSAL_WAIT_S * 1000)})
    p.produce(topic, "intruder", b"must not be written", on_delivery=lambda err, _m: delivery.append(err))
    deadline = time.monotonic() + REFUSAL_WAIT_S + 5  # the report comes at message.timeout.ms at the latest
    while not delivery and time.monotonic() < deadline:
        p.poll(0.5)
    assert delivery, "no delivery report within the message timeout"
    return errors, delivery[0]


def test_settings_in_the_environment_secure_every_client(broker: LocalBroker, sasl_env: dict[str, str],
                                                         ns: Topics) -> None:
    bootstrap = sasl_env["APPRENTICE_KAFKA_BOOTSTRAP"]
    assert librdkafka_config()["security.protocol"] == "sasl_plaintext"
    assert librdkafka_config()["sasl.password"] == broker.password(access.INFERENCE)   # from the mounted file
    assert set(list_topics(bootstrap)) >= {s.name for s in ns.specs()}     # DESCRIBE: every topic is seen

    producer = EventProducer(bootstrap, client_id="sasl-test")             # no security argument: env
    fb = events_pb2.FeedbackEvent(interaction_id=f"i-{uuid.uuid4()}", kind="thumbs", value=1.0)
    producer.produce(ns.feedback, fb.interaction_id, fb)
    producer.flush(30)
    assert (producer.delivered, producer.failed) == (1, 0)

    grader = broker.security(access.GRADER)                                # its reader, with its own group
    consumer = EventConsumer(bootstrap, ns.group_id("apprentice-grader-sasl"), [ns.feedback], security=grader)
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.poll_batch(timeout=1.0)
        assert [events_pb2.FeedbackEvent.FromString(m.value()).interaction_id for m in got] == [fb.interaction_id]
        consumer.commit(got)
    finally:
        consumer.close()
    # the one reader (shared/kafka/reader.py) builds its consumer through the one factory, secured the same
    # way; without credentials it fails instead of reading an empty topic
    assert [events_pb2.FeedbackEvent.FromString(m.value() or b"").interaction_id
            for m in read_topic_to_end(bootstrap, ns.feedback, purpose="grader-sasl-test", security=grader)
            ] == [fb.interaction_id]
    with pytest.raises((KafkaException, TimeoutError)):
        list(read_topic_to_end(bootstrap, ns.feedback, purpose="sasl-test", security=PLAINTEXT, timeout_s=5))


@pytest.mark.parametrize("who", ["no credentials", "wrong password", "unknown user"])
def test_clients_without_valid_credentials_are_refused(broker: LocalBroker, sasl_env: dict[str, str],
                                                       ns: Topics, who: str) -> None:
    bootstrap = sasl_env["APPRENTICE_KAFKA_BOOTSTRAP"]
    pw = broker.password(access.INFERENCE)
    security = {"no credentials": PLAINTEXT,
                "wrong password": KafkaSecurity(protocol="SASL_PLAINTEXT", username=access.INFERENCE,
                                                password=pw + "x"),
                "unknown user": KafkaSecurity(protocol="SASL_PLAINTEXT", username="mallory", password=pw)}[who]
    t0 = time.monotonic()
    with pytest.raises(KafkaException) as e:
        admin(bootstrap, quiet=True, security=security).list_topics(timeout=REFUSAL_WAIT_S)
    assert e.value.args[0].code() == KafkaError._TRANSPORT        # the broker closed the connection
    assert time.monotonic() - t0 < REFUSAL_WAIT_S + 2

    errors, delivery = _refused(bootstrap, security, ns.interactions)
    assert delivery is not None and delivery.code() == KafkaError._MSG_TIMED_OUT
    codes = {err.code() for err in errors}
    if who == "no credentials":
        assert KafkaError._AUTHENTICATION not in codes and codes & {KafkaError._TRANSPORT,
                                                                    KafkaError._ALL_BROKERS_DOWN}
    else:
        auth = [err for err in errors if err.code() == KafkaError._AUTHENTICATION]
        assert auth and "invalid credentials" in auth[0].str()
    # nothing reached the topic (read back as admin)
    assert read_all(bootstrap, ns.interactions, timeout=5, idle=1.0, security=broker.security(access.ADMIN)) == []


def test_a_broker_that_refuses_this_homes_admin_is_named_not_reused(broker: LocalBroker, tmp_path: Path) -> None:
    other = LocalBroker(tmp_path, port=broker.port, controller_port=broker.controller_port)
    st = other.status()
    assert st.refuses_admin and st.foreign and not st.running
    with pytest.raises(BrokerError, match="refuses this home's admin credentials"):
        other.start(timeout=10)


def test_cli_start_reuses_the_broker_and_prints_the_operators_settings(
        broker: LocalBroker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.broker.cli import kafka

    monkeypatch.setenv("APPRENTICE_HOME", str(broker.home.parent))
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", broker.bootstrap)
    assert kafka(["start", "--no-topics"]) == 0
    out = capsys.readouterr().out
    assert f"at {broker.bootstrap} (SASL_PLAINTEXT, ACLs on)" in out and f"(pid {broker.status().pid})" in out
    for name, value in broker.client_env(access.OPERATOR).items():
        assert f"{name}={value}" in out
    assert not any(broker.password(p) in out for p in (*access.PRINCIPALS, access.ADMIN))   # paths, no secrets
    assert kafka(["status"]) == 0
    assert "kafka broker up" in capsys.readouterr().out


CONFIG = """
version: sasl-1
tasks:
  - tenant: acme
    task: support
    feedback_window_s: 120
    graders:
      - {name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}
"""


def test_inference_and_grader_run_through_the_sasl_listener(
        broker: LocalBroker, sasl_env: dict[str, str], ns: Topics, tiny_model_name: str, tmp_path: Path) -> None:
    bootstrap = sasl_env["APPRENTICE_KAFKA_BOOTSTRAP"]
    assert CommonSettings().kafka_security_protocol == "SASL_PLAINTEXT"
    cfg = tmp_path / "grader.yaml"
    cfg.write_text(CONFIG)
    # the grader process: this process's environment with the grader's own credentials; this process
    # (the inference service) runs as `inference`, the test reads graded records as admin
    grader = GraderProcess({**grader_env(ns.prefix, bootstrap, cfg, tmp_path), **broker.client_env(access.GRADER)},
                           tmp_path / "grader.log").start()
    app = start_inference(tmp_path / "inference", model=tiny_model_name, bootstrap=bootstrap,
                          topic_prefix=ns.prefix, follow_updates=False, heartbeat_interval_s=0, http_port=0)
    reader = TopicReader(bootstrap, ns.graded, security=broker.security(access.ADMIN))
    try:
        with InferenceClient(f"127.0.0.1:{app.port}", tenant="acme") as client:
            r = client.generate([{"role": "user", "content": "is my order resolved?"}], max_new_tokens=6,
                                seed=1, session_id="sasl-session", task="support")
            iid = r.choices[0].interaction_id
            client.feedback(iid, "kpi", 1.0, kpi_name="resolved")
        recs = reader.wait_for(lambda rs: by_interaction(rs, iid), timeout=120, parse=graded)
        mine = by_interaction(recs, iid)
        assert len(mine) == 1, f"{len(mine)} graded records for {iid}; grader log:\n{grader.log_tail()}"
        rec = mine[0]
        assert (rec.reward, rec.has_signal, rec.success) == (1.0, True, True), grader.log_tail()
        assert [f.kind for f in rec.feedback] == ["kpi"]                # feedback captured and joined
        assert rec.interaction.response_text == r.choices[0].text
        assert grader.alive(), grader.log_tail()
    finally:
        reader.close()
        app.stop(2)
        grader.stop()
