"""The compose stack's Kafka init (tools/deploy_acls.py compose-secrets, compose-apply) against a real,
authorizing broker: a private local broker (SASL-only, StandardAuthorizer), never the session broker,
whose users this test re-keys.

After compose-apply, each principal logs in with the password generated into its own folder (and no
longer with any other), may do what the access table grants in the deployment's namespace and nothing
else; applying again creates nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka.admin import broker_answers, ensure_topics
from shared.kafka.security import KafkaSecurity
from tests.helpers.kafka import private_broker, produce_one
from tools import deploy_acls
from tools.broker.acls import describe_acls, grants

pytestmark = pytest.mark.timeout(300)


def test_compose_init_gives_each_principal_its_generated_password_and_exactly_its_acls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = private_broker(tmp_path / "broker")
    broker.start()
    try:
        topics = Topics(f"compose-{uuid.uuid4().hex[:8]}.")
        ensure_topics(broker.bootstrap, topics, security=broker.security(access.ADMIN))
        root = tmp_path / "kafka-secrets"
        deploy_acls.compose_secrets(root)
        for key, value in broker.client_env(access.ADMIN).items():
            monkeypatch.setenv(key, value)

        users, created = deploy_acls.compose_apply(root, topics, timeout=60)
        # the broker's start applied the unprefixed deployment's ACLs: those not namespaced were there
        assert users == len(access.PRINCIPALS) and created == len(set(grants(topics)) - set(grants(Topics())))
        assert deploy_acls.compose_apply(root, topics, timeout=60) == (users, 0), "applying twice adds nothing"
        assert set(grants(topics)) <= set(describe_acls(broker.admin_client(), topics))

        def grader(password: str) -> KafkaSecurity:
            return KafkaSecurity(protocol="SASL_PLAINTEXT", mechanism="SCRAM-SHA-512", username=access.GRADER,
                                 password=password)

        generated = (root / access.GRADER / "password").read_text()
        assert broker_answers(broker.bootstrap, timeout=10, security=grader(generated))
        assert not broker_answers(broker.bootstrap, timeout=5, security=grader(broker.password(access.GRADER))), \
            "the broker's own password for grader still works: the compose password was not set"
        assert produce_one(broker.bootstrap, grader(generated), topics.graded) is None
        refused = produce_one(broker.bootstrap, grader(generated), topics.interactions)
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    finally:
        broker.stop()
