"""compose/docker-compose.yml: valid for Docker Compose, and faithful to the ports and services of docs/architecture.md §2."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose" / "docker-compose.yml"
PORTS = {"inference": {"50051", "8000", "9101"}, "grader": {"9102"}, "extractor": {"50053", "9103"},
         "trainer": {"9104"}, "weights": {"50052", "9105"}}


def _compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    cmd = _compose_command()
    if cmd is None:
        pytest.skip("no Docker Compose client here (neither `docker compose` nor `docker-compose`)")
    out = subprocess.run([*cmd, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "inference" in out.stdout and "apache/kafka" in out.stdout


def test_stack_has_broker_topic_init_and_five_services_with_design_ports() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["kafka-init"]["command"] == ["topics"]
    for name, ports in PORTS.items():
        svc = services[name]
        assert svc["command"] == ["serve", name]
        assert {p.split(":")[0] for p in svc["ports"]} == ports
        assert "healthcheck" in svc
        assert svc["build"]["dockerfile"] == "compose/Dockerfile"
        assert svc["environment"]["APPRENTICE_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert (REPO / "compose" / "Dockerfile").exists()


def test_services_run_with_authentication_and_tls_from_mounted_secrets() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert services["secrets-init"]["command"][:2] == ["secrets", "init"]
    for name in PORTS:
        svc = services[name]
        env = svc["environment"]
        assert env["APPRENTICE_AUTH_KEYS_FILE"].startswith("/secrets/") and env["APPRENTICE_TLS_CERT"].startswith("/secrets/")
        assert "secrets:/secrets:ro" in svc["volumes"], name
        assert "secrets-init" in svc["depends_on"], name
        assert "insecure_channel" not in str(svc["healthcheck"]["test"]), name
        assert not any("API_KEYS" in k and v for k, v in env.items()), "no secret values in the compose file"


def _env_list(value: str) -> dict[str, str]:
    """`NAME://host:port,...` -> {NAME: host:port}."""
    return dict(item.split("://", 1) for item in value.split(","))


def test_broker_log_dir_is_on_the_volume_and_host_tools_have_a_listener() -> None:
    kafka = yaml.safe_load(COMPOSE.read_text())["services"]["kafka"]
    env = kafka["environment"]
    # The image's launch script would default log.dirs to /tmp/kraft-combined-logs, outside the volume:
    # recreating the container would then lose every topic, the compacted knowledge base included.
    mounts = dict(v.split(":")[:2][::-1] for v in kafka["volumes"] if isinstance(v, str))
    assert mounts.get(env["KAFKA_LOG_DIRS"]) == "kafka-data", (env["KAFKA_LOG_DIRS"], mounts)
    listeners, advertised = _env_list(env["KAFKA_LISTENERS"]), _env_list(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocols) and set(advertised) <= set(listeners)
    assert advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]] == "kafka:9092", "containers dial kafka:9092"
    host = [name for name, addr in advertised.items() if addr.startswith("localhost:")]
    assert len(host) == 1, advertised
    port = advertised[host[0]].split(":")[1]
    assert listeners[host[0]].endswith(f":{port}")
    assert f"127.0.0.1:{port}:{port}" in kafka["ports"], "the host listener is published, on loopback only"


def test_gpu_profile_serves_inference_with_vllm_on_a_reserved_nvidia_gpu() -> None:
    from services.inference.settings import InferenceSettings, VllmEngineSettings

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    gpu = [s for s in services.values() if "gpu" in s.get("profiles", [])]
    assert len(gpu) == 1
    svc = gpu[0]
    assert svc["command"] == ["serve", "inference"]
    engine = svc["environment"]["APPRENTICE_INFERENCE_ENGINE__KIND"]
    assert InferenceSettings(engine=VllmEngineSettings.model_validate({"kind": engine})).engine.kind == "vllm"
    assert svc["build"]["args"]["APPRENTICE_EXTRAS"] == "[gpu]", "the image needs the gpu extra (vLLM)"
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), devices
    # it answers as `inference` (the grader's judge and the extractor dial that name) on the same ports,
    # and the CPU service can be scaled to zero beside it
    assert "inference" in svc["networks"]["default"]["aliases"]
    assert {p.split(":")[0] for p in svc["ports"]} == PORTS["inference"]
    assert "secrets:/secrets:ro" in svc["volumes"] and svc["environment"]["APPRENTICE_TLS_CERT"].startswith("/secrets/")
    assert "APPRENTICE_CPU_INFERENCE_REPLICAS" in str(services["inference"]["deploy"]["replicas"])
    assert "ARG APPRENTICE_EXTRAS" in (REPO / "compose" / "Dockerfile").read_text()


def test_dockerignore_keeps_local_state_and_secrets_out_of_the_build_context() -> None:
    patterns = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    for required in (".venv", ".venv-*", ".apprentice", ".git", "runs", "**/node_modules", "**/__pycache__",
                     ".pytest_cache", ".mypy_cache", ".tools"):
        assert required in patterns, required
    # nothing the image build copies is excluded
    for copied in ("shared", "services", "protos", "compose", "clients", "pyproject.toml", "README.md"):
        assert copied not in patterns


def test_dashboard_prometheus_and_grafana_services() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    dash = services["dashboard"]
    assert dash["command"] == ["dashboard"] and "8080:8080" in dash["ports"]
    assert dash["environment"]["APPRENTICE_AUTH_TOKEN_FILE"] == "/secrets/operator.token"
    assert "secrets-init" in dash["depends_on"] and "secrets:/secrets:ro" in dash["volumes"]

    prom, graf = services["prometheus"], services["grafana"]
    assert prom["ports"] == ["127.0.0.1:9090:9090"] and graf["ports"] == ["127.0.0.1:3000:3000"]
    prom_mounts = {v.split(":")[0]: v.split(":")[1] for v in prom["volumes"] if isinstance(v, str)}
    assert prom_mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    graf_mounts = {v.split(":")[0]: v.split(":")[1] for v in graf["volumes"]}
    assert graf_mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert "./grafana/dashboards" in graf_mounts
    # Grafana gets its own generated admin password, never the services' keys
    assert not any(v.startswith("secrets:") for v in graf["volumes"])
    assert graf["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith(graf_mounts["grafana-secrets"])

    prom_file = REPO / "compose" / "prometheus" / "prometheus.yml"
    if prom_file.exists():  # the scrape config names every service's metrics port as compose publishes it
        targets = {t for job in yaml.safe_load(prom_file.read_text())["scrape_configs"]
                   for sc in job.get("static_configs", []) for t in sc["targets"]}
        metrics = {"inference": "9101", "grader": "9102", "extractor": "9103", "trainer": "9104", "weights": "9105"}
        assert {f"{name}:{port}" for name, port in metrics.items()} <= targets, targets
    provisioning = REPO / "compose" / "grafana" / "provisioning" / "dashboards"
    for f in provisioning.glob("*.y*ml"):  # dashboards are read from where compose mounts them
        paths = {p["options"]["path"] for p in yaml.safe_load(f.read_text()).get("providers", [])}
        assert paths <= {graf_mounts["./grafana/dashboards"]}, paths


def test_file_conforms_to_the_compose_specification_schema() -> None:
    """Where no Compose client runs (CI), the Compose Specification's own JSON schema checks every key
    and type: tests/data/compose-spec.json is the Compose Specification's published JSON schema (the
    compose-spec project, Apache-2.0, commit 170098b, June 2026)."""
    import json

    import jsonschema

    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    spec = yaml.safe_load(COMPOSE.read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(spec)]
    assert not errors, errors
    spec["services"]["kafka"]["volume"] = ["kafka-data:/var/lib/kafka/data"]  # a typo the schema must catch
    assert any("volume" in e.message for e in validator.iter_errors(spec))
