"""A stack gives each service its own Kafka principal (SECURITY.md §4), never the credentials of the
process that starts it (the tests' and the demo's admin, the CLI's operator)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts import topic_access as access
from tools.broker.local_broker import LocalBroker
from tools.stack.stack import LocalStack
from tools.stack.supervisor import SERVICES


def test_each_service_of_a_private_stack_runs_as_its_own_principal(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    broker = LocalBroker(tmp_path / "broker", port=29492, controller_port=29493)
    for name, value in broker.client_env(access.ADMIN).items():    # this process: the broker's admin
        monkeypatch.setenv(name, value)
    stack = LocalStack(tmp_path / "run", "tiny-random", secure=False)
    assert stack.sasl_dir == broker.sasl_dir
    for name in SERVICES:
        env = stack.supervisor.child(name).env
        assert env["APPRENTICE_KAFKA_SASL_USERNAME"] == name
        assert env["APPRENTICE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["APPRENTICE_KAFKA_SASL_PASSWORD_FILE"] == str(broker.password_file(name).resolve())
        assert env["APPRENTICE_KAFKA_SASL_PASSWORD"] == ""           # no inherited secret overrides the file


def test_credentials_of_the_users_own_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "mine.password"
    secret.write_text("x\n")
    monkeypatch.setenv("APPRENTICE_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("APPRENTICE_KAFKA_SASL_USERNAME", "team-user")
    monkeypatch.setenv("APPRENTICE_KAFKA_SASL_PASSWORD_FILE", str(secret))
    stack = LocalStack(tmp_path / "run", "tiny-random", secure=False)
    assert stack.sasl_dir is None
    assert {stack.supervisor.child(n).env["APPRENTICE_KAFKA_SASL_USERNAME"] for n in SERVICES} == {"team-user"}
