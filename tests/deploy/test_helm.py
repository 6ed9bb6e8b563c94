"""deploy/helm/apprentice: lints, renders and validates, and its manifests agree with the code.

helm is built from its Go module (pinned below) into `.tools/bin/` on first use and reused afterwards;
without Go these tests skip. Rendered manifests are validated against Kubernetes' own schemas
(`kubernetes-validate`, strict: unknown fields fail) at the oldest and newest Kubernetes versions the chart
supports; the Strimzi and Prometheus-operator resources, which those schemas do not cover, are checked
for the fields their operators require. The remaining tests hold the chart to the services it deploys:
every APPRENTICE_* variable is a real setting, every address names a Service port, the topics are the
ones in shared/contracts/topics.py, the grader config loads, and the generated keys and certificates work with a
real gRPC server and the chart's own readiness probe.
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "apprentice"
TOOLS = REPO / ".tools" / "bin"
HELM_MODULE = "helm.sh/helm/v3/cmd/helm"
HELM_VERSION = "v3.22.0"
KUBE_VERSIONS = ("1.30.0", "1.37.0")
"""The chart's `kubeVersion` floor and the newest version kubernetes-validate knows."""
RELEASE, NAMESPACE = "prod", "apprentice"
FULL = f"{RELEASE}-apprentice"

SCALED_GPU_STRIMZI: dict[str, Any] = {
    "kafka": {"strimzi": {"enabled": True, "replicas": 3, "storage": {"class": "fast-ssd"}}},
    "inference": {"replicas": 6, "engine": "vllm", "device": "cuda", "dtype": "bfloat16", "gpus": 1,
                  "image": {"repository": "registry.example/apprentice-gpu", "tag": "0.1.0-cuda"},
                  "nodeSelector": {"nvidia.com/gpu.present": "true"},
                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                  "env": {"APPRENTICE_INFERENCE_ENGINE__GPU_MEMORY_UTILIZATION": "0.9"}},
    "grader": {"replicas": 6, "podDisruptionBudget": {"maxUnavailable": 2}},
    "trainer": {"gpus": 2, "ranks": 2, "tenant": "shop"},
    "weights": {"replicas": 2, "persistence": {"accessMode": "ReadWriteMany", "storageClass": "cephfs"}},
    "auth": {"tenants": ["shop", "default"]},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
}
EXTERNAL_SASL: dict[str, Any] = {
    "kafka": {"external": {"bootstrap": "b-1.kafka.example:9096,b-2.kafka.example:9096",
                           "securityProtocol": "SASL_SSL", "saslUsername": "apprentice",
                           "saslPasswordSecret": {"name": "kafka-credentials", "key": "password"},
                           "caSecret": {"name": "kafka-ca", "key": "ca.pem"}}},
    "auth": {"existingSecret": "apprentice-keys"},
    "tls": {"existingSecret": "apprentice-tls"},
    "dashboard": {"enabled": False},
}
RECORD_PUBLIC_KEYS: dict[str, str] = {f"{p}@{i:016x}": f"{i:02x}" * 32 for i, p in enumerate(
    ("extractor", "grader", "inference", "operator", "trainer", "weights"))}
"""Stand-ins for `python -m tools.record_keys helm-values` (the chart refuses to render without public keys
while signatures are required): every value set carries them."""
RECORD_KEYS: dict[str, Any] = {"recordKeys": {"publicKeys": RECORD_PUBLIC_KEYS}}
VALUE_SETS = {"default": RECORD_KEYS, "strimzi-gpu-scaled": {**SCALED_GPU_STRIMZI, **RECORD_KEYS},
              "external-sasl": {**EXTERNAL_SASL, **RECORD_KEYS}}


def _build_helm() -> Path:
    """The pinned helm, built once per machine (the Go build and module caches make rebuilds quick)."""
    binary, stamp = TOOLS / "helm", TOOLS / "helm.version"
    if binary.exists() and stamp.exists() and stamp.read_text().strip() == HELM_VERSION:
        return binary
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if Path(p).exists()), None)
    if go is None:
        pytest.skip(f"Go is not installed: cannot build helm {HELM_VERSION} from {HELM_MODULE}")
    TOOLS.mkdir(parents=True, exist_ok=True)
    with open(TOOLS / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it right now
        if not (stamp.exists() and stamp.read_text().strip() == HELM_VERSION and binary.exists()):
            env = {**os.environ, "GOBIN": str(TOOLS), "GOFLAGS": "-buildvcs=false"}
            started = time.monotonic()
            out = subprocess.run([go, "install", f"{HELM_MODULE}@{HELM_VERSION}"], env=env, capture_output=True,
                                 text=True, timeout=1500)
            assert out.returncode == 0, f"building helm failed:\n{out.stderr[-4000:]}"
            stamp.write_text(HELM_VERSION + "\n")
            print(f"built helm {HELM_VERSION} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return binary


@pytest.fixture(scope="module")
def helm() -> Path:
    return _build_helm()


def _values_file(tmp: Path, name: str) -> list[str]:
    if not VALUE_SETS[name]:
        return []
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(VALUE_SETS[name]))
    return ["-f", str(path)]


def _template(helm: Path, tmp: Path, name: str, kube: str = KUBE_VERSIONS[0],
              extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                           "--kube-version", kube, *_values_file(tmp, name), *extra],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def rendered(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each value set rendered once: its list of manifests."""
    tmp = tmp_path_factory.mktemp("values")
    out: dict[str, list[dict[str, Any]]] = {}
    for name in VALUE_SETS:
        res = _template(helm, tmp, name)
        assert res.returncode == 0, f"{name}: {res.stderr}"
        out[name] = [d for d in yaml.safe_load_all(res.stdout) if d]
    return out


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def _containers(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                yield d, c


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


# --- helm itself ----------------------------------------------------------------------------------------

@pytest.mark.timeout(1800)  # the first run on a machine builds helm (about 5 minutes on 2 cores)
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_lint_passes_strictly(helm: Path, tmp_path: Path, name: str) -> None:
    res = subprocess.run([str(helm), "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSIONS[0],
                          *_values_file(tmp_path, name)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_bad_values_fail_with_a_clear_message(helm: Path, tmp_path: Path) -> None:
    res = _template(helm, tmp_path, "default", extra=("--set", "kafka.external.bootstrap="))
    assert res.returncode != 0 and "kafka.external.bootstrap is required" in res.stderr
    res = _template(helm, tmp_path, "default", extra=("--set", "kafka.external.securityProtocol=SASL_SSL"))
    assert res.returncode != 0 and "saslPasswordSecret.name is required" in res.stderr
    res = _template(helm, tmp_path, "default", extra=("--kube-version", "1.27.0"))
    assert res.returncode != 0 and "kubeVersion" in res.stderr
    res = _template(helm, tmp_path, "default", extra=("--set", "weights.replicas=2"))
    assert res.returncode != 0 and "weights.persistence.accessMode=ReadWriteMany" in res.stderr
    res = _template(helm, tmp_path, "default", extra=("--set", "recordKeys.publicKeys=null"))
    assert res.returncode != 0 and "recordKeys.publicKeys is empty" in res.stderr
    res = _template(helm, tmp_path, "default", extra=("--set", "recordKeys.publicKeys.grader@12=ab"))
    assert res.returncode != 0 and "is not <principal>@<key_id>" in res.stderr


# --- schemas ------------------------------------------------------------------------------------------

STRIMZI = "kafka.strimzi.io/v1beta2"


def _check_strimzi(doc: dict[str, Any], clusters: set[str]) -> None:
    kind, spec, name = doc["kind"], doc.get("spec") or {}, doc["metadata"]["name"]
    assert doc["apiVersion"] == STRIMZI, f"{kind}/{name}: apiVersion {doc['apiVersion']}"
    assert len(name) <= 63 and name.replace("-", "").replace(".", "").isalnum() and name == name.lower(), name
    if kind == "Kafka":
        listeners = spec["kafka"]["listeners"]
        assert listeners and all({"name", "port", "type", "tls"} <= set(lis) for lis in listeners), listeners
        assert all(lis["type"] in ("internal", "route", "loadbalancer", "nodeport", "ingress", "cluster-ip")
                   for lis in listeners)
        assert isinstance(spec["kafka"]["version"], str) and "topicOperator" in spec["entityOperator"]
        assert doc["metadata"]["annotations"]["strimzi.io/node-pools"] == "enabled"
        return
    assert doc["metadata"]["labels"]["strimzi.io/cluster"] in clusters, f"{kind}/{name}: unknown cluster"
    if kind == "KafkaNodePool":
        assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1
        assert spec["roles"] and set(spec["roles"]) <= {"controller", "broker"}
        volumes = spec["storage"]["volumes"]
        assert spec["storage"]["type"] == "jbod" and volumes
        assert all(v["type"] in ("persistent-claim", "ephemeral") and isinstance(v["id"], int) for v in volumes)
        assert sum(v.get("kraftMetadata") == "shared" for v in volumes) == 1
    elif kind == "KafkaTopic":
        assert isinstance(spec["partitions"], int) and spec["partitions"] >= 1
        assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1
        assert all(isinstance(v, str) for v in spec["config"].values()), spec["config"]
    elif kind == "KafkaUser":
        assert spec["authentication"]["type"] in ("scram-sha-512", "tls", "tls-external")
        for acl in spec.get("authorization", {}).get("acls", []):
            res = acl["resource"]
            assert res["type"] in ("topic", "group", "cluster", "transactionalId"), acl
            assert res["type"] == "cluster" or (res["name"] and res["patternType"] in ("literal", "prefix")), acl
            assert acl["operations"] and set(acl["operations"]) <= {
                "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "AlterConfigs",
                "DescribeConfigs", "IdempotentWrite", "All"}, acl
    else:
        raise AssertionError(f"unexpected Strimzi kind {kind}")


def _check_service_monitor(doc: dict[str, Any], services: list[dict[str, Any]]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    selector = doc["spec"]["selector"]["matchLabels"]
    matched = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    assert matched, "the ServiceMonitor selects no Service"
    for ep in doc["spec"]["endpoints"]:
        assert ep["port"] and ep["path"].startswith("/")
    port_names = {p["name"] for s in matched for p in s["spec"]["ports"]}
    assert {ep["port"] for ep in doc["spec"]["endpoints"]} <= port_names
    # every Apprentice Deployment's metrics are scraped
    assert sum("metrics" in {p["name"] for p in s["spec"]["ports"]} for s in matched) == 5


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(
        rendered: dict[str, list[dict[str, Any]]], kube: str) -> None:
    import kubernetes_validate

    for name, docs in rendered.items():
        clusters = {d["metadata"]["name"] for d in _kind(docs, "Kafka")}
        for doc in docs:
            where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
            if doc["apiVersion"].startswith("kafka.strimzi.io/"):
                _check_strimzi(doc, clusters)
            elif doc["apiVersion"].startswith("monitoring.coreos.com/"):
                _check_service_monitor(doc, _kind(docs, "Service"))
            else:
                try:
                    kubernetes_validate.validate(doc, kube, strict=True)
                except kubernetes_validate.ValidationError as e:
                    raise AssertionError(f"{where} (Kubernetes {kube}): {e.message} at {list(e.path)}") from None


def test_value_sets_render_what_they_ask_for(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default, scaled, ext = rendered["default"], rendered["strimzi-gpu-scaled"], rendered["external-sasl"]
    assert {d["metadata"]["name"] for d in _kind(default, "Deployment")} == {
        f"{FULL}-{c}" for c in ("inference", "grader", "extractor", "trainer", "weights", "dashboard")}
    assert not [d for d in default if d["apiVersion"].startswith(("kafka.strimzi.io", "monitoring."))]
    assert _kind(default, "Job"), "external Kafka: the topics job creates the topics"

    inf = _one(scaled, "Deployment", f"{FULL}-inference")
    assert inf["spec"]["replicas"] == 6 and _one(scaled, "Deployment", f"{FULL}-grader")["spec"]["replicas"] == 6
    pod = inf["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and c["image"] == "registry.example/apprentice-gpu:0.1.0-cuda"
    assert _env(c)["APPRENTICE_INFERENCE_ENGINE__KIND"] == "vllm" and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "APPRENTICE_INFERENCE_ENGINE__DEVICE" not in _env(c), "a transformers setting would fail the vllm kind"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"]), "vLLM needs /dev/shm"
    assert {d["kind"] for d in scaled} >= {"Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser", "ServiceMonitor"}
    assert not _kind(scaled, "Job"), "Strimzi mode declares topics as KafkaTopic resources"
    pdbs = {d["metadata"]["name"]: d for d in _kind(scaled, "PodDisruptionBudget")}
    assert pdbs[f"{FULL}-grader"]["spec"]["maxUnavailable"] == 2 and f"{FULL}-inference" in pdbs
    weights = _one(scaled, "Deployment", f"{FULL}-weights")
    assert weights["spec"]["replicas"] == 2 and weights["spec"]["strategy"]["type"] == "RollingUpdate"
    assert _one(scaled, "PersistentVolumeClaim", f"{FULL}-weights")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert f"{FULL}-weights" in pdbs and f"{FULL}-weights" not in {d["metadata"]["name"] for d in _kind(default, "PodDisruptionBudget")}
    assert _one(default, "Deployment", f"{FULL}-weights")["spec"]["strategy"]["type"] == "Recreate"
    (trainer,) = _one(scaled, "Deployment", f"{FULL}-trainer")["spec"]["template"]["spec"]["containers"]
    assert trainer["command"][:3] == ["python", "-m", "torch.distributed.run"] and "--nproc_per_node=2" in trainer["command"]
    assert trainer["args"] == ["serve", "trainer"]
    assert "command" not in _one(default, "Deployment", f"{FULL}-trainer")["spec"]["template"]["spec"]["containers"][0]

    assert not _kind(ext, "Secret"), "existing secrets are used, none generated"
    assert not [d for d in ext if d["metadata"]["name"].endswith("-dashboard")]


# --- the chart against the code it deploys --------------------------------------------------------------

def _settings_env_names() -> dict[str, set[str]]:
    """APPRENTICE_* variable names each service reads, from its settings classes (nested groups included:
    the same walk that writes docs/settings.md)."""
    from tools.settings_reference import SERVICES, variables

    found = variables()
    common = {v.name for v in found["common"]}
    names = {service: common | {v.name for v in found[service]} for service in SERVICES}
    names["topics"] = common
    return names


def test_every_apprentice_variable_is_a_setting_of_the_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    known = _settings_env_names()
    for name, docs in rendered.items():
        for doc, c in _containers(docs):
            component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
            if component not in known:
                continue  # the dashboard before services/dashboard exists
            unknown = {k for k in _env(c) if k.startswith("APPRENTICE_")} - known[component]
            assert not unknown, f"{name}: {component} sets variables it does not read: {sorted(unknown)}"


def test_addresses_name_service_ports_and_probes_name_container_ports(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in rendered.items():
        ports = {(s["metadata"]["name"], str(p["port"])) for s in _kind(docs, "Service") for p in s["spec"]["ports"]}
        for _doc, c in _containers(docs):
            for key, value in _env(c).items():
                if key.endswith(("_ENDPOINT", "_TARGET")) and "$(" not in value:
                    host, _, port = value.rpartition(":")
                    assert (host, port) in ports, f"{name}: {key}={value} is not a Service port"
            names = {p["name"] for p in c.get("ports", [])} | {str(p["containerPort"]) for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = c.get(probe, {})
                for handler in ("httpGet", "tcpSocket"):
                    if handler in spec:
                        assert str(spec[handler]["port"]) in names, f"{name}: {c['name']} {probe}"
                if "exec" in spec:
                    port = spec["exec"]["command"][2]
                    assert port in names, f"{name}: {c['name']} {probe} checks port {port}"
        for svc in _kind(docs, "Service"):
            selector = svc["spec"]["selector"]
            pods = [d for d in _kind(docs, "Deployment")
                    if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
            assert len(pods) == 1, f"{name}: Service {svc['metadata']['name']} selects {len(pods)} Deployments"
            container_ports = {p["name"] for p in pods[0]["spec"]["template"]["spec"]["containers"][0]["ports"]}
            assert {p["targetPort"] for p in svc["spec"]["ports"]} <= container_ports


def test_the_service_monitor_presents_the_metrics_key(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Prometheus scrapes with the generated key of role `metrics` (per-tenant series, no RPC or HTTP API:
    tests/security/test_metrics_role.py), and the key ring accepts it."""
    docs = rendered["strimzi-gpu-scaled"]
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"] == {
        "type": "Bearer", "credentials": {"name": f"{FULL}-auth", "key": "metrics.token"}}
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == f"{FULL}-auth")
    assert secret["stringData"]["metrics.token"]
    assert any(line.startswith(f"metrics:{FULL}-metrics=sha256:") for line in secret["stringData"]["keys.txt"].splitlines())


def test_strimzi_topics_are_the_contract_topics(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from shared.contracts.topics import SPECS

    topics = {d["spec"]["topicName"]: d["spec"] for d in _kind(rendered["strimzi-gpu-scaled"], "KafkaTopic")}
    assert set(topics) == {s.name for s in SPECS}
    for s in SPECS:
        t = topics[s.name]
        assert t["partitions"] == s.partitions and t["replicas"] == 3, s.name
        assert t["config"]["retention.ms"] == str(s.retention_ms), s.name
        assert (t["config"].get("cleanup.policy") == "compact") == s.compacted, s.name
    # the services authenticate to the TLS listener as a KafkaUser each, with the cluster CA (which user,
    # with which ACLs: tests/deploy/test_helm_acls.py)
    users = {u["metadata"]["name"] for u in _kind(rendered["strimzi-gpu-scaled"], "KafkaUser")}
    (kafka,) = _kind(rendered["strimzi-gpu-scaled"], "Kafka")
    for _doc, c in _containers(rendered["strimzi-gpu-scaled"]):
        env = _env(c)
        assert env["APPRENTICE_KAFKA_BOOTSTRAP"] == f"{kafka['metadata']['name']}-kafka-bootstrap:9093"
        assert env["APPRENTICE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["APPRENTICE_KAFKA_SASL_USERNAME"] in users


def test_a_capacity_overlay_sizes_the_topics_and_the_workers(helm: Path, tmp_path: Path) -> None:
    """docs/capacity.md's 10,000 requests/s: the stream topics get its partitions, every workload (and the
    topics Job) its APPRENTICE_STREAM_PARTITIONS, the grader its workers."""
    overlay = CHART / "capacity" / "10000rps.yaml"
    sizing = yaml.safe_load(overlay.read_text(encoding="utf-8"))
    p = sizing["kafka"]["streamPartitions"]
    res = _template(helm, tmp_path, "strimzi-gpu-scaled", extra=("-f", str(overlay)))
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    topics = {d["spec"]["topicName"]: d["spec"] for d in _kind(docs, "KafkaTopic")}
    stream = {"apprentice.interactions.v1", "apprentice.feedback.v1", "apprentice.graded.v1"}
    assert {n: t["partitions"] for n, t in topics.items() if n in stream} == dict.fromkeys(stream, p)
    assert all(t["partitions"] < p for n, t in topics.items() if n not in stream)
    assert {_env(c)["APPRENTICE_STREAM_PARTITIONS"] for _d, c in _containers(docs)} == {str(p)}
    grader = _one(docs, "Deployment", f"{FULL}-grader")
    assert grader["spec"]["replicas"] == sizing["grader"]["replicas"] <= p
    (pool,) = _kind(docs, "KafkaNodePool")
    assert pool["spec"]["replicas"] == sizing["kafka"]["strimzi"]["replicas"]


def test_grader_configmap_is_the_packaged_default_config(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from services.grader.settings import DEFAULT_CONFIG
    from shared.grading.schema import load_grader_config, parse_grader_config

    cm = _one(rendered["default"], "ConfigMap", f"{FULL}-grader")
    chart = parse_grader_config(yaml.safe_load(cm["data"]["grader.yaml"]), source="the chart's grader.config")
    assert chart.model_dump() == load_grader_config(DEFAULT_CONFIG).model_dump(), (
        "values.yaml grader.config differs from services/grader/default_config.yaml: update one from the other")


def test_generated_credentials_work_with_a_real_server_and_the_readiness_probe(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """The generated key ring admits each generated token with its role; the generated certificate serves
    TLS for the Service names; the chart's probe script reads a real server's health through it."""
    from shared.rpc.grpc_util import create_server, set_serving
    from shared.security.identity import Role
    from shared.security.keys import KeyRing
    from shared.settings import CommonSettings

    docs = rendered["default"]
    auth = _one(docs, "Secret", f"{FULL}-auth")["stringData"]
    ring = KeyRing.from_text(auth["keys.txt"], origin="keys.txt")
    assert f"={auth['service.token']}" not in auth["keys.txt"], "the ring holds digests, not tokens"
    for token, role in (("service.token", Role.SERVICE), ("operator.token", Role.OPERATOR),
                        ("backend-default.token", Role.BACKEND)):
        identity = ring.lookup_token(auth[token])
        assert identity is not None and identity.role is role, token
    assert ring.lookup_token("x" * 43) is None

    tls = {k: base64.b64decode(v) for k, v in _one(docs, "Secret", f"{FULL}-tls")["data"].items()}
    for k, v in tls.items():
        (tmp_path / k).write_bytes(v)
    (tmp_path / "keys.txt").write_text(auth["keys.txt"])
    probe = tmp_path / "health_probe.py"
    probe.write_text(_one(docs, "ConfigMap", f"{FULL}-probe")["data"]["health_probe.py"])
    common = CommonSettings(auth_keys_file=tmp_path / "keys.txt", tls_cert=tmp_path / "tls.crt",
                            tls_key=tmp_path / "tls.key", tls_ca=tmp_path / "ca.crt")
    server, port, health = create_server(0, lambda s: None, ["apprentice.v1.Weights"], host="127.0.0.1",
                                         common=common)
    server.start()
    try:
        def probe_rc(name: str) -> tuple[int, list[str]]:
            env = {**os.environ, "APPRENTICE_TLS_CA": str(tmp_path / "ca.crt")}
            res = subprocess.run([sys.executable, str(probe), str(port), name], env=env, capture_output=True,
                                 text=True, timeout=60)
            return res.returncode, res.stderr.strip().splitlines()[-1:]

        set_serving(health, ["apprentice.v1.Weights"], serving=False)
        assert probe_rc(f"{FULL}-weights") == (1, [f"127.0.0.1:{port} reports NOT_SERVING"])
        set_serving(health, ["apprentice.v1.Weights"], serving=True)
        for name in (f"{FULL}-weights", f"{FULL}-inference.{NAMESPACE}.svc", f"{FULL}-extractor"):
            assert probe_rc(name) == (0, []), name
        # a name the certificate does not cover fails the TLS handshake
        assert probe_rc("somewhere-else.example") == (1, [f"health check of 127.0.0.1:{port}: UNAVAILABLE"])
    finally:
        server.stop(0)
