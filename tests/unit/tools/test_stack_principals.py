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


def test_a_stack_starts_its_homes_broker_when_it_holds_its_credentials(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI fills in the home's admin credentials whenever they exist, also after `apprentice kafka stop`:
    the stack must then start that broker (its own home's), not assume it runs (the demo used to fail with a
    DescribeAcls time-out)."""
    home = tmp_path / "home"
    broker = LocalBroker(home, port=29492, controller_port=29493)
    for name, value in broker.client_env(access.ADMIN).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("APPRENTICE_HOME", str(home))
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:29492")
    stack = LocalStack(tmp_path / "run", "tiny-random", secure=False)
    assert stack._starts is not None and stack._starts.sasl_dir == broker.sasl_dir
    other = LocalBroker(tmp_path / "elsewhere", port=29494, controller_port=29495)
    for name, value in other.client_env(access.ADMIN).items():      # credentials of another home's broker
        monkeypatch.setenv(name, value)
    assert LocalStack(tmp_path / "run2", "tiny-random", secure=False)._starts is None


def test_a_private_stack_lives_inside_the_configured_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`APPRENTICE_TOPIC_PREFIX=staging. apprentice demo`: each run's namespace is inside `staging.`, so the ACLs
    it applies and the topics it creates are that prefix's (and no other prefix's: shared/kafka/grants.py)."""
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "staging.")
    stack = LocalStack(tmp_path / "run", "tiny-random", secure=False, services=("grader", "trainer"))
    assert stack.topics.prefix.startswith("staging.run-") and stack.topics.prefix.endswith(".")
    assert {c.name for c in stack.supervisor.children} == {"grader", "trainer"}
    for c in stack.supervisor.children:
        assert c.env["APPRENTICE_TOPIC_PREFIX"] == stack.topics.prefix
    monkeypatch.delenv("APPRENTICE_TOPIC_PREFIX")
    assert LocalStack(tmp_path / "run2", "tiny-random", secure=False).topics.prefix.startswith("run-")
    with pytest.raises(ValueError, match="no service"):
        LocalStack(tmp_path / "run3", "tiny-random", secure=False, services=("nope",))
