"""A request the secured broker refuses reads as ONE line naming the principal, the resource, the operation and
the command that grants it (#51): exit 2 at start, a counted error at run time, never a traceback; and a
prefixed deployment is set up by the documented commands alone.

Real processes (`apprentice serve NAME`, `apprentice topics`, `apprentice tail`) and real clients against the
session's broker (tests/conftest.py: SASL only, ACLs on), each as its own principal, in fresh topic namespaces
whose ACLs were never applied (what a new user's `APPRENTICE_TOPIC_PREFIX=staging.` meets), or applied
without the topics.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka import authorization as authz
from shared.kafka.admin import admin, delete_topics, ensure_topics
from shared.kafka.authorization import KafkaAccessDenied
from shared.kafka.consumer import EventConsumer
from shared.kafka.producer import EventProducer
from shared.kafka.reader import read_topic_to_end
from shared.startup import EXIT_STARTUP_ERROR
from tests.helpers.ports import free_port
from tools.broker.acls import apply_acls, describe_acls, grants
from tools.broker.local_broker import local_credentials_dir, principal_env, principal_security

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0   # a cold start imports torch on a busy 2-core machine
SERVICES = ("inference", "grader", "extractor", "trainer", "weights", "dashboard")


@pytest.fixture(scope="module")
def sasl_dir(kafka_bootstrap: str) -> Path:
    d = local_credentials_dir(os.environ)
    assert d is not None, "the session's broker must hand this process the local broker's admin credentials"
    return d


def fresh_prefix(label: str) -> str:
    return f"test-{label}-{uuid.uuid4().hex[:8]}."


@pytest.fixture
def bare(kafka_bootstrap: str, sasl_dir: Path) -> Iterator[Topics]:
    """A namespace whose topics exist (created by admin) but whose ACLs were never applied."""
    t = Topics(fresh_prefix("bare"))
    ensure_topics(kafka_bootstrap, t, security=principal_security(sasl_dir, access.ADMIN))
    yield t
    with contextlib.suppress(Exception):
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()], security=principal_security(sasl_dir, access.ADMIN))


def clean_env(home: Path, bootstrap: str, prefix: str) -> dict[str, str]:
    """A process environment with no Kafka credentials of this test process (they are the admin's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
    env.update(APPRENTICE_HOME=str(home), APPRENTICE_KAFKA_BOOTSTRAP=bootstrap, APPRENTICE_TOPIC_PREFIX=prefix,
               APPRENTICE_LOG_JSON="false", PYTHONUNBUFFERED="1", APPRENTICE_MODEL="tiny-random",
               APPRENTICE_TORCH_THREADS="1")
    return env


def service_env(name: str, home: Path, bootstrap: str, prefix: str, sasl_dir: Path) -> dict[str, str]:
    """`name` as its own principal, on free ports, loopback, no gRPC keys."""
    env = clean_env(home, bootstrap, prefix)
    env.update(principal_env(sasl_dir, name))
    if name != "dashboard":     # it has none of its own
        env[f"APPRENTICE_{name.upper()}_METRICS_PORT"] = str(free_port())
    if name in ("inference", "weights", "extractor", "dashboard"):
        env[f"APPRENTICE_{name.upper()}_PORT"] = str(free_port())
    if name == "inference":
        env.update(APPRENTICE_INFERENCE_HTTP_PORT="0", APPRENTICE_INFERENCE_FOLLOW_UPDATES="false",
                   APPRENTICE_INFERENCE_HEARTBEAT_INTERVAL_S="0", APPRENTICE_INFERENCE_HOST="127.0.0.1")
    if name == "trainer":
        env["APPRENTICE_TRAINER_WEIGHTS_ENDPOINT"] = "127.0.0.1:1"
    return env


def apprentice(*args: str, env: dict[str, str], timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def one_line(proc: subprocess.CompletedProcess[str], command: str, *needles: str) -> str:
    """Exit 2, no traceback, exactly one `apprentice COMMAND: ...` line on stderr holding every needle."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_STARTUP_ERROR, f"exit {proc.returncode}; output:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"apprentice {command}: ")]
    assert len(lines) == 1, proc.stderr[-4000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- at start: a real process without the grant ---------------------------------------------------------
@pytest.mark.parametrize("name", SERVICES)
def test_a_service_without_its_acls_stops_in_one_line(name: str, bare: Topics, kafka_bootstrap: str,
                                                       sasl_dir: Path, tmp_path: Path) -> None:
    proc = apprentice("serve", name, env=service_env(name, tmp_path, kafka_bootstrap, bare.prefix, sasl_dir))
    line = one_line(proc, name, f"the Kafka broker refuses principal '{name}' ", bare.prefix,
                    f"`apprentice kafka acls --prefix {bare.prefix} --apply`", "kafka-acls-sh --prefix")
    # the resource and the operation: one of the principal's own grants in this namespace
    granted = {(g.resource, g.name, g.operation) for g in grants(bare) if g.principal == name}
    assert any(f"{op} on {authz.RESOURCE_WORDS[res]} '{n}'" in line for res, n, op in granted), line


def test_a_service_started_before_its_topics_is_told_to_create_them(kafka_bootstrap: str, sasl_dir: Path,
                                                                    tmp_path: Path) -> None:
    """The deployment's ACLs are there, its topics are not: the extractor (which creates missing topics when
    its principal may) names `apprentice topics`, the operator's command that may."""
    t = Topics(fresh_prefix("notopics"))
    apply_acls(admin(kafka_bootstrap, security=principal_security(sasl_dir, access.ADMIN)), grants(t))
    proc = apprentice("serve", "extractor", env=service_env("extractor", tmp_path, kafka_bootstrap, t.prefix, sasl_dir))
    one_line(proc, "extractor", "the Kafka broker refuses principal 'extractor' CREATE on topic "
             f"'{t.prefix}apprentice.", "the topic does not exist",
             f"`APPRENTICE_TOPIC_PREFIX={t.prefix} apprentice topics`")


# --- the CLI ------------------------------------------------------------------------------------------------
def test_topics_sets_up_a_prefixed_deployment_on_the_local_broker(kafka_bootstrap: str, sasl_dir: Path) -> None:
    """`APPRENTICE_TOPIC_PREFIX=P apprentice topics`, as written, on the local broker: as the broker's admin it
    applies P's ACLs (exactly the table's for P), as `operator` it creates P's topics (exactly those); then the
    extractor, as its own principal, sees them all."""
    t = Topics(fresh_prefix("cli"))
    su = principal_security(sasl_dir, access.ADMIN)
    home = sasl_dir.parent.parent          # the broker's home: the CLI finds the operator's credentials there
    try:
        proc = apprentice("topics", env=clean_env(home, kafka_bootstrap, t.prefix), timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        created = {ln.removeprefix("created ") for ln in proc.stdout.splitlines() if ln.startswith("created ")}
        assert created == {s.name for s in t.specs()}
        assert f"ACL bindings created for the prefix '{t.prefix}' on the local broker" in proc.stdout
        assert set(describe_acls(admin(kafka_bootstrap, security=su), t)) == set(grants(t))
        seen = admin(kafka_bootstrap, security=principal_security(sasl_dir, access.EXTRACTOR)).list_topics(timeout=10)
        assert {s.name for s in t.specs()} <= set(seen.topics)
        again = apprentice("topics", env=clean_env(home, kafka_bootstrap, t.prefix), timeout=120)
        assert again.returncode == 0 and "created" not in again.stdout and "ACL" not in again.stdout, again.stdout
    finally:
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()], security=su)


def test_topics_on_a_cluster_whose_acls_are_missing_is_one_line(kafka_bootstrap: str, sasl_dir: Path,
                                                                tmp_path: Path) -> None:
    """Credentials of the operator's own (not this home's local broker, whose admin the CLI could act as): the
    refused CREATE names the principal, the topic and the command that grants the prefix's ACLs."""
    t = Topics(fresh_prefix("ext"))
    own = tmp_path / "operator.password"
    shutil.copy(sasl_dir / "operator.password", own)
    env = clean_env(tmp_path, kafka_bootstrap, t.prefix)
    env.update(APPRENTICE_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", APPRENTICE_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
               APPRENTICE_KAFKA_SASL_USERNAME="operator", APPRENTICE_KAFKA_SASL_PASSWORD_FILE=str(own))
    proc = apprentice("topics", env=env, timeout=120)
    one_line(proc, "topics", "the Kafka broker refuses principal 'operator' DESCRIBE on topic "
             f"'{t.prefix}apprentice.", f"`apprentice kafka acls --prefix {t.prefix} --apply`")


def test_tail_without_the_grants_is_one_line(bare: Topics, kafka_bootstrap: str, sasl_dir: Path,
                                             tmp_path: Path) -> None:
    """`apprentice tail` as `operator` in a namespace whose ACLs were never applied; as `analytics`, which
    the table lets read graded records but not through the CLI's tail group."""
    env = clean_env(tmp_path, kafka_bootstrap, bare.prefix)
    env.update(principal_env(sasl_dir, access.OPERATOR))
    proc = apprentice("tail", "graded", "--from-beginning", "--timeout", "60", env=env, timeout=120)
    one_line(proc, "tail", "the Kafka broker refuses principal 'operator' READ on ",
             f"`apprentice kafka acls --prefix {bare.prefix} --apply`")
    apply_acls(admin(kafka_bootstrap, security=principal_security(sasl_dir, access.ADMIN)), grants(bare))
    env.update(principal_env(sasl_dir, access.ANALYTICS))
    proc = apprentice("tail", "graded", "--from-beginning", "--timeout", "60", env=env, timeout=120)
    one_line(proc, "tail", "the Kafka broker refuses principal 'analytics' READ on consumer group "
             f"'{bare.prefix}apprentice-tail-", "does not grant it to 'analytics'")


# --- at run time: counted, never raised ---------------------------------------------------------------------
def test_run_time_refusals_are_counted_and_logged_not_raised(bare: Topics, kafka_bootstrap: str, sasl_dir: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A consumer whose group and a producer whose topic the broker refuses (ACLs removed while they run,
    here never applied) keep running; each refusal is counted and logged as its one line."""
    ex = principal_security(sasl_dir, access.EXTRACTOR)
    before = {k: authz.REFUSALS.labels(*k)._value.get() for k in (("group", "READ"), ("topic", "WRITE"))}
    with caplog.at_level(logging.ERROR):
        consumer = EventConsumer(kafka_bootstrap, bare.group_id("extractor"), [bare.graded], security=ex)
        try:
            deadline = time.monotonic() + 30
            while authz.REFUSALS.labels("group", "READ")._value.get() == before[("group", "READ")]:
                assert time.monotonic() < deadline, "no group refusal counted within 30 s"
                assert consumer.poll_batch(timeout=0.5) == []
        finally:
            consumer.close()
        producer = EventProducer(kafka_bootstrap, security=ex, extra_config={"message.timeout.ms": 10000})
        failures: list[object] = []
        producer.produce(bare.knowledge, b"k", b"v", on_delivery=lambda err, _m: failures.append(err))
        producer.poll(0)
        deadline = time.monotonic() + 30
        while not failures and time.monotonic() < deadline:
            producer.poll(0.2)
        assert failures and failures[0] is not None
    assert authz.REFUSALS.labels("topic", "WRITE")._value.get() > before[("topic", "WRITE")]
    lines = [r.getMessage() for r in caplog.records if "the Kafka broker refuses" in r.getMessage()]
    assert any(f"principal 'extractor' READ on consumer group '{bare.group_id('extractor')}'" in ln for ln in lines), lines
    assert any(f"principal 'extractor' WRITE on topic '{bare.knowledge}'" in ln for ln in lines), lines
    assert all(f"apprentice kafka acls --prefix {bare.prefix} --apply" in ln for ln in lines), lines


def test_a_read_to_the_end_that_is_refused_says_so_at_once(bare: Topics, kafka_bootstrap: str, sasl_dir: Path) -> None:
    """Not a ReadTimeout after the whole timeout, nor "the topic is missing": the refusal."""
    t0 = time.monotonic()
    with pytest.raises(KafkaAccessDenied) as e:
        list(read_topic_to_end(kafka_bootstrap, bare.knowledge, purpose="extractor-rebuild",
                               security=principal_security(sasl_dir, access.EXTRACTOR), timeout_s=60))
    assert time.monotonic() - t0 < 30
    assert (e.value.principal, e.value.resource, e.value.name) == ("extractor", "topic", bare.knowledge)
