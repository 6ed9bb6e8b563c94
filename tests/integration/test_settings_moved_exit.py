"""A service started with a variable of the old flat layout (one that moved into a settings group) exits
with status 2 and one line naming the new variable, before Kafka, gRPC or a model are touched (a real
process: shared/startup.py turns shared/settings.py's SettingMoved into that line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts.topics import Topics
from tests.integration.test_service_startup import SERVICES, assert_one_line_exit, run_to_exit, service_env

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("service", "old", "new"), [
    ("extractor", "APPRENTICE_EXTRACTOR_OPENAI_MODEL", "APPRENTICE_EXTRACTOR_LLM__MODEL"),
    ("inference", "APPRENTICE_INFERENCE_ENGINE", "APPRENTICE_INFERENCE_ENGINE__KIND"),
])
def test_an_old_variable_stops_the_service_with_one_line(service: str, old: str, new: str, tmp_path: Path) -> None:
    env = service_env(SERVICES[service], tmp_path, Topics(prefix="unused."), "127.0.0.1:1")   # exits first
    env[old] = "vllm" if service == "inference" else "gpt-4o-mini"
    proc = run_to_exit(service, env)
    assert_one_line_exit(proc, service, f"{old} was renamed: set {new}")


@pytest.mark.parametrize(("service", "env_set", "needle"), [
    ("extractor", {"APPRENTICE_EXTRACTOR_LLM__KIND": "openai", "APPRENTICE_EXTRACTOR_LLM__MODEL": "m",
                   "APPRENTICE_EXTRACTOR_LLM__MODELL": "a-typo"}, "llm.openai.modell: Extra inputs are not permitted"),
    ("inference", {"APPRENTICE_INFERENCE_ENGINE__KIND": "tpu"}, "engine: Input tag 'tpu'"),
])
def test_a_refused_value_stops_the_service_with_one_line(service: str, env_set: dict[str, str], needle: str,
                                                         tmp_path: Path) -> None:
    env = {**service_env(SERVICES[service], tmp_path, Topics(prefix="unused."), "127.0.0.1:1"), **env_set}
    proc = run_to_exit(service, env)
    line = assert_one_line_exit(proc, service, "invalid settings", needle)
    assert "a-typo" not in line
