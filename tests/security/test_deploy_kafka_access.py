"""Kafka credentials and ACLs in the docker compose stack (SECURITY.md §4, "Kafka ACLs in Helm/compose").

Attacks, each stopped here:
- a container on the compose network (or a tool on the host) produces to any topic without credentials:
  the broker serves no PLAINTEXT listener and refuses what no ACL grants (StandardAuthorizer);
- a compromised service uses its Kafka credentials beyond its role (the grader's password writing
  interactions, the dashboard's writing anything): every service logs in as its own principal, whose ACLs
  are the access table's (tools/deploy_acls.py compose-apply applies `tools.broker.acls.grants()`);
- a compromised service reads another principal's password, or admin's, from a shared secrets volume:
  each container mounts only its own folder of the kafka-secrets volume;
- a password in the repository, or a guessable one: generated at first start, 256 random bits, owner-only.

The Helm chart's side (KafkaUsers, their ACLs and Secrets) is tests/deploy/test_helm_acls.py.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from shared.contracts import topic_access as access

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose" / "docker-compose.yml"
KAFKA_CLIENTS = {"inference": access.INFERENCE, "inference-gpu": access.INFERENCE, "grader": access.GRADER,
                 "extractor": access.EXTRACTOR, "trainer": access.TRAINER, "weights": access.WEIGHTS,
                 "dashboard": access.DASHBOARD}
"""Compose service -> the principal it must log in as."""


def _services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _kafka_secret_mounts(svc: dict[str, Any]) -> list[dict[str, Any]]:
    """The service's mounts of the kafka-secrets volume, in long form."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, str):
            source, target, *mode = v.split(":")
            if source == "kafka-secrets":
                out.append({"source": source, "target": target, "read_only": mode == ["ro"]})
        elif v.get("source") == "kafka-secrets":
            out.append(v)
    return out


def test_compose_broker_authenticates_every_client_and_authorizes_every_request() -> None:
    env = _services()["kafka"]["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = [item.split("://")[0] for item in env["KAFKA_LISTENERS"].split(",")]
    assert all(protocols[name].startswith("SASL_") for name in listeners), protocols
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert env["KAFKA_SUPER_USERS"] == f"User:{access.ADMIN}"
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    # admin's PLAIN login stays on the container network: the host listener takes SCRAM only
    host = next(name for name, addr in (i.split("://") for i in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
                if addr.startswith("localhost:"))
    assert env[f"KAFKA_LISTENER_NAME_{host}_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    # the broker's admin password comes from the volume, through the start script's JAAS file
    script = (REPO / "compose" / "kafka" / "broker.sh").read_text()
    assert "java.security.auth.login.config" in script and "/run/kafka-admin/password" in script


def test_each_compose_service_is_its_own_principal_and_mounts_only_its_own_password() -> None:
    services = _services()
    for name, principal in KAFKA_CLIENTS.items():
        svc = services[name]
        env = svc["environment"]
        assert env["APPRENTICE_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT", name
        assert env["APPRENTICE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
        assert env["APPRENTICE_KAFKA_SASL_USERNAME"] == principal, name
        assert "APPRENTICE_KAFKA_SASL_PASSWORD" not in env, "never a password in the compose file"
        (mount,) = _kafka_secret_mounts(svc)
        assert mount["volume"]["subpath"] == principal and mount["read_only"] is True, (name, mount)
        assert env["APPRENTICE_KAFKA_SASL_PASSWORD_FILE"] == f"{mount['target']}/password", name
        assert "kafka-access-init" in svc["depends_on"], f"{name} would start before its user and ACLs exist"
    # whoever else mounts the volume: the generator (all, to write), the ACL init (all, read-only: it sets
    # every user's credential), the broker and the topics init (admin's folder only)
    for name, svc in services.items():
        mounts = _kafka_secret_mounts(svc)
        if name in KAFKA_CLIENTS or not mounts:
            continue
        if name == "kafka-secrets-init":
            assert svc["entrypoint"][-2:] == ["compose-secrets", mounts[0]["target"]]
        elif name == "kafka-access-init":
            assert mounts[0]["read_only"] and "subpath" not in mounts[0].get("volume", {})
            assert svc["entrypoint"][-2:] == ["compose-apply", mounts[0]["target"]]
            assert svc["environment"]["APPRENTICE_KAFKA_SASL_USERNAME"] == access.ADMIN
        else:
            assert name in ("kafka", "kafka-init"), f"{name} mounts Kafka passwords"
            assert [m["volume"]["subpath"] for m in mounts] == [access.ADMIN], name


def test_compose_passwords_are_generated_once_private_and_distinct(tmp_path: Path) -> None:
    from tools.deploy_acls import compose_secrets

    root = tmp_path / "kafka-secrets"
    assert sorted(compose_secrets(root)) == sorted((*access.PRINCIPALS, access.ADMIN))
    passwords = {}
    for principal in (*access.PRINCIPALS, access.ADMIN):
        f = root / principal / "password"
        passwords[principal] = f.read_text()
        assert len(passwords[principal]) >= 43, "256 random bits"
        assert stat.S_IMODE(f.stat().st_mode) == 0o400 and stat.S_IMODE(f.parent.stat().st_mode) == 0o700
    assert len(set(passwords.values())) == len(passwords)
    # a restart keeps every password; a removed one (rotation) is the only one made anew
    assert compose_secrets(root) == []
    (root / access.GRADER / "password").unlink()
    assert compose_secrets(root) == [access.GRADER]
    assert (root / access.GRADER / "password").read_text() != passwords[access.GRADER]
    assert (root / access.TRAINER / "password").read_text() == passwords[access.TRAINER]
