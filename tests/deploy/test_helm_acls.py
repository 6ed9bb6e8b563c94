"""The chart's Kafka authorization is the access table (shared/contracts/topic_access.py): the KafkaUsers it
renders grant exactly `tools.broker.acls.grants()` of the release's topic prefix, each workload
authenticates as its own principal with its own Secret, and the generated files are in step with the table.

The chart is rendered by the pinned helm of tests/deploy/test_helm.py (skipped without Go to build it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from tests.deploy.test_helm import CHART, FULL, KUBE_VERSIONS, NAMESPACE, RECORD_KEYS, RELEASE, _build_helm
from tools import deploy_acls
from tools.broker.acls import grants

WORKLOADS = {"inference": access.INFERENCE, "grader": access.GRADER, "extractor": access.EXTRACTOR,
             "trainer": access.TRAINER, "weights": access.WEIGHTS, "dashboard": access.DASHBOARD,
             "topics": access.ADMIN}
"""Chart component -> the principal its pods authenticate as."""


def _render(tmp: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    helm = _build_helm()
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump({**RECORD_KEYS, **values}))
    res = subprocess.run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version",
                          KUBE_VERSIONS[0], "-f", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _strimzi(prefix: str, admin_user: bool = False) -> dict[str, Any]:
    return {"topicPrefix": prefix, "kafka": {"strimzi": {"enabled": True, "adminUser": admin_user}}}


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _workloads(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(component, container env, pod spec) of every Deployment and Job."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            pod = d["spec"]["template"]["spec"]
            (c,) = pod["containers"]
            env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
            out.append((d["metadata"]["labels"]["app.kubernetes.io/component"], env, pod))
    return out


def _kafka_secret(pod: dict[str, Any]) -> tuple[str, str]:
    """(Secret name, key) the pod's Kafka password file comes from."""
    (vol,) = [v for v in pod["volumes"] if v["name"] == "kafka-user"]
    (item,) = vol["secret"]["items"]
    assert item["path"] == "password"
    return vol["secret"]["secretName"], item["key"]


def test_generated_chart_acl_file_is_the_access_table() -> None:
    assert deploy_acls.HELM_FILE.read_text() == deploy_acls.helm_file(), "run `make helm-acls`"
    # and the derivation it is made of gives back exactly grants() for any prefix
    for prefix in ("", "staging."):
        derived = {g for r in deploy_acls.rules() for g in r.grants(prefix)}
        assert derived == set(grants(Topics(prefix))), prefix


@pytest.mark.parametrize("prefix", ["", "staging."])
def test_strimzi_kafka_users_grant_exactly_the_access_table(tmp_path: Path, prefix: str) -> None:
    docs = _render(tmp_path, _strimzi(prefix))
    users = {u["metadata"]["name"]: u for u in _kind(docs, "KafkaUser")}
    assert set(users) == set(access.PRINCIPALS), "one KafkaUser per principal, named after it (no admin unless asked)"
    for user in users.values():
        assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
        assert user["spec"]["authorization"]["type"] == "simple"
        for acl in user["spec"]["authorization"]["acls"]:
            assert acl["host"] == "*" and acl["operations"], acl
            assert set(acl["resource"]) <= {"type", "name", "patternType"}, acl
    rendered = deploy_acls.strimzi_grants(list(users.values()))
    wanted = set(grants(Topics(prefix)))
    assert rendered == wanted, (f"chart grants more: {sorted(map(str, rendered - wanted))}\n"
                                f"chart lacks: {sorted(map(str, wanted - rendered))}")
    (kafka,) = _kind(docs, "Kafka")
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple"}, "no super user unless adminUser"
    assert kafka["spec"]["entityOperator"]["userOperator"]["secretPrefix"] == f"{FULL}-kafka-"


def test_strimzi_admin_user_is_the_only_super_user_and_has_no_acls(tmp_path: Path) -> None:
    docs = _render(tmp_path, _strimzi("", admin_user=True))
    (kafka,) = _kind(docs, "Kafka")
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple", "superUsers": [access.ADMIN]}
    (admin,) = [u for u in _kind(docs, "KafkaUser") if u["metadata"]["name"] == access.ADMIN]
    assert "authorization" not in admin["spec"]


def test_each_strimzi_workload_is_its_own_principal_with_its_own_secret(tmp_path: Path) -> None:
    docs = _render(tmp_path, _strimzi(""))
    seen = set()
    for component, env, pod in _workloads(docs):
        principal = WORKLOADS[component]
        assert env["APPRENTICE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["APPRENTICE_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["APPRENTICE_KAFKA_SASL_USERNAME"] == principal, component
        assert env["APPRENTICE_KAFKA_SASL_PASSWORD_FILE"] == "/secrets/kafka-user/password"
        assert "APPRENTICE_KAFKA_SASL_PASSWORD" not in env, "never the password itself"
        assert _kafka_secret(pod) == (f"{FULL}-kafka-{principal}", "password"), component
        seen.add(principal)
    assert seen == set(access.SERVICES), "every service runs, each as itself (Strimzi declares topics: no Job)"


def test_external_sasl_gives_each_workload_its_principal_and_secret(tmp_path: Path) -> None:
    docs = _render(tmp_path, {"kafka": {"external": {
        "bootstrap": "b-1.kafka.example:9096", "securityProtocol": "SASL_SSL",
        "saslPasswordSecret": {"name": "kafka-{principal}", "key": "pw"}}}})
    seen = set()
    for component, env, pod in _workloads(docs):
        principal = WORKLOADS[component]
        assert env["APPRENTICE_KAFKA_SASL_USERNAME"] == principal, component
        assert _kafka_secret(pod) == (f"kafka-{principal}", "pw"), component
        seen.add(principal)
    assert seen == {*access.SERVICES, access.ADMIN}, "the topics Job creates topics as admin"


def test_deployment_doc_lists_the_generated_kafka_acls_commands() -> None:
    doc = (deploy_acls.REPO / "docs" / "deployment.md").read_text()
    commands = deploy_acls.kafka_acls_commands()
    missing = [c for c in commands if c not in doc]
    assert not missing, f"docs/deployment.md lacks {len(missing)} generated commands, e.g. {missing[0]}"
    listed = [line for line in doc.splitlines() if line.startswith("kafka-acls.sh ")]
    assert sorted(listed) == sorted(commands), "docs/deployment.md lists commands the table does not make"
