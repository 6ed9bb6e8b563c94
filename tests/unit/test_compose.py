"""compose/docker-compose.yml: valid for Docker Compose, and faithful to DESIGN.md's ports and services."""

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
