"""The compose stack's broker, as configured by compose/docker-compose.yml, run for real without Docker.

The apache/kafka image turns each KAFKA_* variable into a server property (its `ub render-properties`:
one `_` is `.`, `__` is `_`, `___` is `-`, lower case; a value holding `=` is silently dropped) and starts
Kafka with KAFKA_OPTS. This test does the same with the compose file's variables (addresses moved to free
loopback ports, the data folder to a temporary one), starts the broker through compose/kafka/broker.sh
(the JAAS file from the generated admin password), runs the init the way compose does
(tools/deploy_acls.py compose-secrets and compose-apply, as admin) and then attacks it: a client without
SASL, a wrong password, admin's PLAIN login on the host listener, and a principal writing a topic the
access table does not give it. Each must be refused, and each principal must work with its own password.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaError

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka.admin import broker_answers, ensure_topics
from shared.kafka.security import KafkaSecurity
from tests.helpers.kafka import link_broker_jars, produce_one
from tests.helpers.ports import free_ports
from tools import deploy_acls

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose" / "docker-compose.yml"
IMAGE_EXCLUDES = {"KAFKA_VERSION", "KAFKA_HEAP_OPT", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS",
                  "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL",
                  "KAFKA_LOG4J_LOGGERS", "KAFKA_TOOLS_LOG4J_LOGLEVEL"}
"""The image's kafka-propertiesSpec.json `excludes`: variables that are not server properties."""


def image_property(variable: str) -> str:
    """The server property the apache/kafka image makes of a KAFKA_* variable."""
    key = re.sub(r"[^_]_[^_]", lambda m: m.group(0).replace("_", "."), variable.removeprefix("KAFKA_"))
    return key.replace("___", "-").replace("__", "_").lower()


def test_image_property_names() -> None:
    assert image_property("KAFKA_LISTENER_NAME_CONTROLLER_SASL_ENABLED_MECHANISMS") == \
        "listener.name.controller.sasl.enabled.mechanisms"
    assert image_property("KAFKA_LISTENER_NAME_INTERNAL_SCRAM___SHA___512_SASL_JAAS_CONFIG") == \
        "listener.name.internal.scram-sha-512.sasl.jaas.config"


def _compose_properties(data: Path, ports: dict[str, int]) -> dict[str, str]:
    env = {k: str(v) for k, v in yaml.safe_load(COMPOSE.read_text())["services"]["kafka"]["environment"].items()}
    dropped = [k for k, v in env.items() if "=" in v]
    assert not dropped, f"the image drops variables whose value holds '=': {dropped}"
    props = {image_property(k): v for k, v in env.items() if k.startswith("KAFKA_") and k not in IMAGE_EXCLUDES}
    for key in ("listeners", "advertised.listeners"):
        props[key] = ",".join(f"{name}://127.0.0.1:{ports[name]}"
                              for name in (item.split("://")[0] for item in props[key].split(",")))
    props["controller.quorum.voters"] = f"1@127.0.0.1:{ports['CONTROLLER']}"
    props["log.dirs"] = str(data)
    return props


def test_compose_broker_refuses_whoever_the_access_table_does_not_allow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java: the local broker cannot run here")
    link_broker_jars(tmp_path)
    libs = tmp_path / "kafka" / "libs"
    if not (libs / ".complete").exists():
        pytest.skip("no Kafka jars (run `apprentice kafka fetch` once)")
    internal, controller, external = free_ports(3)
    ports = {"INTERNAL": internal, "CONTROLLER": controller, "EXTERNAL": external}
    props = _compose_properties(tmp_path / "data", ports)
    props_file = tmp_path / "server.properties"
    props_file.write_text("".join(f"{k}={v}\n" for k, v in sorted(props.items())))
    classpath = f"{libs.resolve()}/*"
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=").replace("-", "A")
    fmt = subprocess.run([java, "-cp", classpath, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                          "-c", str(props_file)], capture_output=True, text=True, timeout=120)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr

    root = tmp_path / "kafka-secrets"
    deploy_acls.compose_secrets(root)
    run = tmp_path / "run"   # stands for the image's /etc/kafka/docker/run: Kafka with KAFKA_OPTS
    run.write_text(f'#!/bin/bash\nexec {java} -Xmx512m $KAFKA_OPTS -cp "{classpath}" kafka.Kafka {props_file}\n')
    run.chmod(0o700)
    jaas_dir = tmp_path / "jaas"
    log = open(tmp_path / "broker.log", "wb")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(["bash", str(REPO / "compose" / "kafka" / "broker.sh")], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "BROKER_ADMIN_PASSWORD_FILE": str(root / "admin" / "password"),
                                 "BROKER_SECRETS_DIR": str(jaas_dir), "BROKER_RUN": str(run)})
    try:
        inside, host = f"127.0.0.1:{internal}", f"127.0.0.1:{external}"
        admin_pw = (root / access.ADMIN / "password").read_text()
        admin = KafkaSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username=access.ADMIN, password=admin_pw)
        deadline = time.monotonic() + 120
        while not broker_answers(inside, timeout=2, security=admin):
            assert proc.poll() is None, (tmp_path / "broker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the compose broker did not accept admin"
            time.sleep(0.5)
        # the healthcheck's client settings: admin's, readable by the broker's user alone
        health = jaas_dir / "admin.properties"
        assert "sasl.mechanism=PLAIN" in health.read_text() and health.stat().st_mode & 0o077 == 0

        # kafka-init and kafka-access-init, as compose runs them
        topics = Topics(f"compose-{uuid.uuid4().hex[:8]}.")
        ensure_topics(inside, topics, security=admin)
        for key, value in {"APPRENTICE_KAFKA_BOOTSTRAP": inside, "APPRENTICE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                           "APPRENTICE_KAFKA_SASL_MECHANISM": "PLAIN", "APPRENTICE_KAFKA_SASL_USERNAME": access.ADMIN,
                           "APPRENTICE_KAFKA_SASL_PASSWORD_FILE": str(root / access.ADMIN / "password")}.items():
            monkeypatch.setenv(key, value)
        deploy_acls.compose_apply(root, topics, timeout=60)

        def scram(principal: str, password: str | None = None) -> KafkaSecurity:
            pw = password if password is not None else (root / principal / "password").read_text()
            return KafkaSecurity(protocol="SASL_PLAINTEXT", mechanism="SCRAM-SHA-512", username=principal, password=pw)

        for principal in access.PRINCIPALS:   # each with its own password, inside and from the host
            assert broker_answers(inside, timeout=10, security=scram(principal)), principal
        assert broker_answers(host, timeout=10, security=scram(access.OPERATOR))
        assert not broker_answers(inside, timeout=5, security=KafkaSecurity()), "a client without SASL"
        assert not broker_answers(inside, timeout=5, security=scram(access.GRADER, "wrong")), "a wrong password"
        assert not broker_answers(host, timeout=5, security=admin), "admin's PLAIN login on the host listener"
        assert produce_one(inside, scram(access.GRADER), topics.graded) is None
        refused = produce_one(inside, scram(access.ANALYTICS), topics.graded)
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
