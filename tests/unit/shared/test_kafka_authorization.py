"""An authorization refusal reads as one line naming the principal, the resource, the operation and the command
that grants it, and that command follows from the access table (shared/kafka/authorization.py): the
deployment's ACLs when the table grants it, `apprentice topics` when a service may not create a missing topic,
the principal's own credentials otherwise. A service whose start meets a client's raw refusal exits 2 with that
line (shared/startup.py)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from shared.kafka import authorization as authz
from shared.kafka.authorization import KafkaAccessDenied, denied
from shared.kafka.security import KafkaSecurity
from shared.startup import EXIT_STARTUP_ERROR, exit_on_startup_error

SCRAM = "SASL_PLAINTEXT"


def sec(user: str) -> KafkaSecurity:
    return KafkaSecurity(protocol=SCRAM, username=user, password="x")


def test_a_grant_of_the_table_names_the_acls_command_of_the_prefix() -> None:
    line = KafkaAccessDenied("extractor", "topic", "staging.apprentice.graded.v1", "READ", "staging.").line()
    assert line.startswith("the Kafka broker refuses principal 'extractor' READ on topic "
                           "'staging.apprentice.graded.v1': the access table grants it"), line
    assert "`apprentice kafka acls --prefix staging. --apply`" in line
    assert "`python -m tools.deploy_acls kafka-acls-sh --prefix staging.`" in line
    assert "\n" not in line
    group = KafkaAccessDenied("grader", "group", "staging.apprentice-grader", "READ", "staging.", more=3).line()
    assert "READ on consumer group 'staging.apprentice-grader' (and 3 more)" in group and "--prefix staging." in group


def test_the_unprefixed_deployment_is_named_without_a_prefix_option() -> None:
    line = KafkaAccessDenied("trainer", "topic", "apprentice.graded.v1", "READ", "").line()
    assert "`apprentice kafka acls --apply`" in line and "--prefix" not in line


def test_a_service_creating_a_missing_topic_is_told_to_run_apprentice_topics() -> None:
    line = KafkaAccessDenied("weights", "topic", "staging.apprentice.audit.v1", "CREATE", "staging.").line()
    assert "CREATE on topic 'staging.apprentice.audit.v1': the topic does not exist" in line
    assert "`APPRENTICE_TOPIC_PREFIX=staging. apprentice topics`" in line
    # the operator may create them: its refusal means the ACLs are missing
    op = KafkaAccessDenied("operator", "topic", "staging.apprentice.audit.v1", "CREATE", "staging.").line()
    assert "the access table grants it" in op and "acls --prefix staging. --apply" in op


def test_what_the_table_does_not_grant_names_the_principal_and_credentials() -> None:
    line = KafkaAccessDenied("trainer", "topic", "staging.apprentice.graded.v1", "WRITE", "staging.").line()
    assert "does not grant it to 'trainer'" in line and "APPRENTICE_KAFKA_SASL_USERNAME" in line
    other = KafkaAccessDenied("grader", "topic", "prod.apprentice.graded.v1", "READ", "staging.").line()
    assert "does not grant it" in other      # another prefix's topic is never granted
    stranger = KafkaAccessDenied("svc-a", "topic", "apprentice.graded.v1", "READ", "").line()
    assert "grants 'svc-a' nothing" in stranger
    anon = KafkaAccessDenied("ANONYMOUS", "topic", "apprentice.graded.v1", "READ", "").line()
    assert "sends no credentials" in anon and "APPRENTICE_KAFKA_SECURITY_PROTOCOL" in anon


def test_client_errors_become_refusals_with_what_the_caller_asked() -> None:
    err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    r = denied(KafkaException(err), name="s.apprentice.feedback.v1", operation="WRITE", security=sec("inference"),
               prefix="s.")
    assert r is not None and (r.principal, r.resource, r.name, r.operation) == (
        "inference", "topic", "s.apprentice.feedback.v1", "WRITE")
    g = denied(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), name="t", group="s.extractor", operation="READ",
               security=sec("extractor"), prefix="s.")
    assert g is not None and (g.resource, g.name) == ("group", "s.extractor")
    c = denied(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Failed to acquire idempotence PID"),
               security=sec("analytics"), prefix="")
    assert c is not None and (c.resource, c.operation) == ("cluster", "IDEMPOTENT_WRITE")
    assert "IDEMPOTENT_WRITE on the cluster" in str(c)
    t = denied(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), security=sec("grader"), prefix="")
    assert t is not None and t.resource == "transactional_id"
    assert denied(KafkaError(KafkaError._TRANSPORT), security=sec("grader"), prefix="") is None
    assert denied(ValueError("no"), prefix="") is None


def test_aiokafka_refusals_are_recognised() -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    r = denied(TopicAuthorizationFailedError(), security=sec("grader"), prefix="")
    assert r is not None and r.resource == "topic" and r.principal == "grader"
    assert authz.is_refusal(GroupAuthorizationFailedError())


def test_the_principal_is_the_sasl_user_or_anonymous() -> None:
    assert authz.principal_of(sec("weights")) == "weights"
    assert authz.principal_of(KafkaSecurity()) == "ANONYMOUS"


def test_run_time_refusals_are_counted_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    before = authz.REFUSALS.labels("group", "READ")._value.get()
    r = KafkaAccessDenied("extractor", "group", "u-1.extractor", "READ", "u-1.")
    with caplog.at_level(logging.ERROR, logger="shared.kafka.authorization"):
        for _ in range(5):
            authz.report(r)
    assert authz.REFUSALS.labels("group", "READ")._value.get() - before == 5
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [r.line()], lines


def test_a_raw_refusal_during_a_start_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_SECURITY_PROTOCOL", SCRAM)
    monkeypatch.setenv("APPRENTICE_KAFKA_SASL_USERNAME", "grader")
    monkeypatch.setenv("APPRENTICE_KAFKA_SASL_PASSWORD", "x")
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "s.")

    @exit_on_startup_error("grader")
    def main() -> int:
        try:
            raise KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
        except KafkaException as e:
            raise RuntimeError("the faust producer could not start") from e

    assert main() == EXIT_STARTUP_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("apprentice grader: the Kafka broker refuses principal 'grader' "
                                               "a request on a transactional id"), err
    assert "apprentice kafka acls --prefix s. --apply" in err[0]


def test_other_errors_keep_their_traceback() -> None:
    @exit_on_startup_error("grader")
    def main() -> int:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    with pytest.raises(KafkaException):
        main()
