"""`apprentice serve trainer` with an experiment log whose package is missing: exit status 2 and one line
naming the setting and the package, before torch, Kafka and the model are needed (a real process)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shared.contracts.topics import Topics
from tests.integration.test_service_startup import SERVICES, assert_one_line_exit, run_to_exit, service_env

pytestmark = pytest.mark.integration


def test_report_to_wandb_without_the_package_exits_with_one_line(tmp_path: Path) -> None:
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here: the trainer would open a real W&B run")
    env = service_env(SERVICES["trainer"], tmp_path, Topics(prefix="unused."), "127.0.0.1:1")   # exits first
    env["APPRENTICE_TRAINER_EXPERIMENT_LOG__KIND"] = "wandb"
    proc = run_to_exit("trainer", env)
    assert_one_line_exit(proc, "trainer", "APPRENTICE_TRAINER_EXPERIMENT_LOG__KIND=wandb", "pip install wandb")
    assert not (tmp_path / "trainer").exists() or not any((tmp_path / "trainer").rglob("ckpt-*"))
