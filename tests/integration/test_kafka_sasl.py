"""Kafka client security against a real broker with a SASL/SCRAM listener.

A private broker (temp home, free ports; the shared one at 9092 is never touched) is formatted and started
plain, stopped, and restarted with a SASL_PLAINTEXT listener, as `apprentice kafka start --sasl` does to an
existing broker: its SCRAM user is created through the Admin API. Then, with the client settings taken
from the environment only (`APPRENTICE_KAFKA_SECURITY_PROTOCOL`, `..._SASL_USERNAME`,
`..._SASL_PASSWORD_FILE`), as a deployment sets them:

- EventProducer / EventConsumer / admin round-trip an event through the SASL listener;
- a client without credentials, with a wrong password, or an unknown user is refused (bounded waits) and
  writes nothing;
- the stack runs through it: the inference service captures a Generate and a Feedback, and the grader
  joins and grades them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.inference.client import InferenceClient
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


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    home = tmp_path_factory.mktemp("sasl-broker")
    link_broker_jars(home)            # reuse the shared broker's jars (else fetch_jars resolves them)
    plain, controller, sasl = free_ports(3)
    first = LocalBroker(home, port=plain, controller_port=controller)
    first.start()                               # formatted without any SCRAM user, no SASL listener
    first.stop(timeout=10)                      # (a clean stop can take 30 s; a kill is as good here)
    b = LocalBroker(home, port=plain, controller_port=controller, sasl_port=sasl)
    try:
        st = b.start()
        assert st.owned and st.sasl_bootstrap == b.sasl_bootstrap
        yield b
    finally:
        b.stop(timeout=10)


@pytest.fixture
def sasl_env(broker: LocalBroker, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Client settings for the SASL listener, in the environment only (password as a mounted file)."""
    env = broker.sasl_env()
    assert "APPRENTICE_KAFKA_SASL_PASSWORD_FILE" in env
    monkeypatch.delenv("APPRENTICE_KAFKA_SASL_PASSWORD", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def ns(broker: LocalBroker, sasl_env: dict[str, str]) -> Iterator[Topics]:
    t = Topics(prefix=f"sasl-{uuid.uuid4().hex[:8]}.")
    ensure_topics(sasl_env["APPRENTICE_KAFKA_BOOTSTRAP"], t)          # admin over SASL, from the environment
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
    assert librdkafka_config()["sasl.password"] == broker.sasl_password()   # read from the mounted file
    assert set(list_topics(bootstrap)) >= {s.name for s in ns.specs()}

    producer = EventProducer(bootstrap, client_id="sasl-test")             # no security argument: env
    fb = events_pb2.FeedbackEvent(interaction_id=f"i-{uuid.uuid4()}", kind="thumbs", value=1.0)
    producer.produce(ns.feedback, fb.interaction_id, fb)
    producer.flush(30)
    assert (producer.delivered, producer.failed) == (1, 0)

    consumer = EventConsumer(bootstrap, f"{ns.prefix}g", [ns.feedback])
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
            for m in read_topic_to_end(bootstrap, ns.feedback, purpose="sasl-test")] == [fb.interaction_id]
    with pytest.raises((KafkaException, TimeoutError)):
        list(read_topic_to_end(bootstrap, ns.feedback, purpose="sasl-test", security=PLAINTEXT, timeout_s=5))
    # the plain listener is still served (existing users, set-up), the controller stays internal
    assert broker_answers(broker.bootstrap, security=PLAINTEXT)


@pytest.mark.parametrize("who", ["no credentials", "wrong password", "unknown user"])
def test_clients_without_valid_credentials_are_refused(broker: LocalBroker, sasl_env: dict[str, str],
                                                       ns: Topics, who: str) -> None:
    bootstrap = sasl_env["APPRENTICE_KAFKA_BOOTSTRAP"]
    security = {"no credentials": PLAINTEXT,
                "wrong password": KafkaSecurity(protocol="SASL_PLAINTEXT", username=broker.sasl_user,
                                                password=broker.sasl_password() + "x"),
                "unknown user": KafkaSecurity(protocol="SASL_PLAINTEXT", username="mallory",
                                              password=broker.sasl_password())}[who]
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
    # nothing reached the topic (read back with the valid credentials from the environment)
    assert read_all(bootstrap, ns.interactions, timeout=5, idle=1.0) == []


def test_reusing_a_broker_without_the_sasl_listener_says_how_to_fix_it(broker: LocalBroker) -> None:
    [unused] = free_ports(1)
    other = LocalBroker(broker.home.parent, port=broker.port, controller_port=broker.controller_port,
                        sasl_port=unused)
    with pytest.raises(BrokerError, match="has no SASL listener .* again with `--sasl`"):
        other.start(timeout=10)


def test_cli_start_with_sasl_reuses_the_broker_and_prints_the_client_settings(
        broker: LocalBroker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.broker.cli import kafka

    monkeypatch.setenv("APPRENTICE_HOME", str(broker.home.parent))
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", broker.bootstrap)
    assert kafka(["start", "--sasl", "--sasl-port", str(broker.sasl_port), "--no-topics"]) == 0
    out = capsys.readouterr().out
    assert f"at {broker.bootstrap} in " in out and f"(pid {broker.status().pid})" in out   # the same broker
    assert f"SASL/SCRAM listener at {broker.sasl_bootstrap}" in out
    for name, value in broker.sasl_env().items():
        assert f"export {name}={value}" in out
    assert broker.sasl_password() not in out                        # the path to the secret, not the secret
    assert kafka(["status", "--sasl", "--sasl-port", str(broker.sasl_port)]) == 0
    assert f"SASL/SCRAM at {broker.sasl_bootstrap}" in capsys.readouterr().out


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
        sasl_env: dict[str, str], ns: Topics, tiny_model_name: str, tmp_path: Path) -> None:
    bootstrap = sasl_env["APPRENTICE_KAFKA_BOOTSTRAP"]
    assert CommonSettings().kafka_security_protocol == "SASL_PLAINTEXT"
    cfg = tmp_path / "grader.yaml"
    cfg.write_text(CONFIG)
    # the grader process inherits this process's environment: the SASL settings of `sasl_env`
    grader = GraderProcess(grader_env(ns.prefix, bootstrap, cfg, tmp_path),
                           tmp_path / "grader.log").start()
    app = start_inference(tmp_path / "inference", model=tiny_model_name, bootstrap=bootstrap,
                          topic_prefix=ns.prefix, follow_updates=False, heartbeat_interval_s=0, http_port=0)
    reader = TopicReader(bootstrap, ns.graded)
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
