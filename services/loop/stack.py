"""A private local stack for one demo or end-to-end run: broker (shared, reused) + the five services as
supervised processes, in their own topic namespace, state folder and free ports."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from services.loop.supervisor import Supervisor
from shared.config import CommonSettings
from shared.kafka.admin import ensure_topics
from shared.topics import Topics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Ports:
    inference: int = field(default_factory=free_port)
    weights: int = field(default_factory=free_port)
    extractor: int = field(default_factory=free_port)
    metrics: dict[str, int] = field(default_factory=lambda: {n: free_port() for n in
                                                              ("inference", "grader", "extractor", "trainer", "weights")})


class LocalStack:
    def __init__(self, run_dir: Path, model: str, *, prefix: str | None = None,
                 service_env: dict[str, dict[str, str]] | None = None) -> None:
        self.run_dir = run_dir
        self.model = model
        self.common = CommonSettings()
        self.topics = Topics(prefix if prefix is not None else f"run-{uuid.uuid4().hex[:8]}.")
        self.ports = Ports()
        env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_TOPIC_PREFIX=self.topics.prefix,
                   APPRENTICE_HOME=str(run_dir), APPRENTICE_KAFKA_BOOTSTRAP=self.common.kafka_bootstrap,
                   PYTHONUNBUFFERED="1")
        p = self.ports
        per_service = {
            "inference": {"APPRENTICE_INFERENCE_PORT": str(p.inference), "APPRENTICE_INFERENCE_HOST": "127.0.0.1",
                          "APPRENTICE_INFERENCE_WEIGHTS_ENDPOINT": self.weights_target,
                          "APPRENTICE_INFERENCE_POD_ID": "pod-0"},
            "weights": {"APPRENTICE_WEIGHTS_PORT": str(p.weights), "APPRENTICE_WEIGHTS_HOST": "127.0.0.1"},
            "grader": {"APPRENTICE_GRADER_INFERENCE_ENDPOINT": self.inference_target},
            "extractor": {"APPRENTICE_EXTRACTOR_GRPC_PORT": str(p.extractor), "APPRENTICE_EXTRACTOR_GRPC_HOST": "127.0.0.1",
                          "APPRENTICE_EXTRACTOR_INFERENCE_TARGET": self.inference_target,
                          "APPRENTICE_EXTRACTOR_TARGET": self.knowledge_target},
            "trainer": {"APPRENTICE_TRAINER_WEIGHTS_ENDPOINT": self.weights_target},
        }
        for name, port in p.metrics.items():
            per_service[name][f"APPRENTICE_{name.upper()}_METRICS_PORT"] = str(port)
        for name, extra in (service_env or {}).items():
            per_service[name].update(extra)
        self.supervisor = Supervisor(run_dir, env=env, service_env=per_service)

    @property
    def inference_target(self) -> str:
        return f"127.0.0.1:{self.ports.inference}"

    @property
    def weights_target(self) -> str:
        return f"127.0.0.1:{self.ports.weights}"

    @property
    def knowledge_target(self) -> str:
        return f"127.0.0.1:{self.ports.extractor}"

    def start(self) -> None:
        from shared.kafka.local_broker import LocalBroker

        host, _, port = self.common.kafka_bootstrap.split(",")[0].rpartition(":")
        LocalBroker(self.common.home, host=host or "127.0.0.1", port=int(port or 9092)).start()
        ensure_topics(self.common.kafka_bootstrap, self.topics)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor.start_background()

    def health(self) -> dict[str, bool]:
        from services.loop.stack_cli import _grpc_healthy, _metrics

        p = self.ports
        return {"inference": _grpc_healthy(p.inference), "weights": _grpc_healthy(p.weights),
                "extractor": _grpc_healthy(p.extractor), "grader": _metrics(p.metrics["grader"]) is not None,
                "trainer": _metrics(p.metrics["trainer"]) is not None}

    def wait_healthy(self, timeout: float) -> dict[str, bool]:
        deadline = time.monotonic() + timeout
        h = self.health()
        while not all(h.values()) and time.monotonic() < deadline:
            time.sleep(2)
            h = self.health()
        return h

    def crashed(self) -> dict[str, list[int]]:
        return {c.name: c.exits for c in self.supervisor.children if c.exits}

    def stop(self) -> None:
        self.supervisor.stop()
