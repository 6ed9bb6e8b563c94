"""A private local stack for one demo, end-to-end or chaos run: broker (shared, reused, or a private one)
+ the five services as supervised processes, in their own topic namespace, state folder and free ports.

`Ports` and `wire_services` are also what `apprentice up` uses, so the wiring between services (who calls
whom on which port) is written once.
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.extractor.settings import ExtractorSettings
from services.grader.settings import GraderSettings
from services.inference.settings import InferenceSettings
from services.trainer.settings import TrainerSettings
from services.weights.settings import WeightsSettings
from shared.contracts.default_ports import DASHBOARD_PORT, DASHBOARD_PORT_VAR
from shared.contracts.stack_endpoints import announce_endpoints, remove_endpoints, write_endpoints
from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from tools.broker.local_broker import LocalBroker
from tools.devca import ensure_dev_credentials
from tools.stack.supervisor import Supervisor, stack_endpoints

if TYPE_CHECKING:
    from shared.contracts.stack_endpoints import StackEndpoints

METRICS_SERVICES = ("inference", "grader", "extractor", "trainer", "weights")


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux: 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free now and stays free until a service binds it: chosen below the kernel's range for
    outgoing connections (a port picked there can be taken by any client's connection, e.g. a Kafka client of
    the same stack, before its service binds it: seen once as "cannot bind the metrics port"), and never
    one this process handed out already."""
    low = _ephemeral_low()
    start = 22000 if low > 23000 else 1024     # 19092-21092: private brokers of the tests
    for _ in range(200):
        port = random.randrange(start, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:                  # a crowded range: what the kernel picks
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Ports:
    """Where each service listens. The default is free ports (private stacks never collide with a stack
    that is already up); `configured()` is what the services' own settings name."""

    inference: int = field(default_factory=free_port)
    weights: int = field(default_factory=free_port)
    extractor: int = field(default_factory=free_port)
    metrics: dict[str, int] = field(default_factory=lambda: {n: free_port() for n in METRICS_SERVICES})
    http: int = field(default_factory=free_port)
    """The inference service's OpenAI-compatible HTTP API (0 = off)."""
    dashboard: int = field(default_factory=free_port)
    """The operator dashboard (services/dashboard/)."""

    @classmethod
    def configured(cls) -> Ports:
        """The defaults of docs/architecture.md §2 (50051-50053, 9101-9105) with the services' APPRENTICE_* overrides: what
        `apprentice up` binds, so one setting moves both the server and everything that calls it. The
        dashboard's port comes from its contract (shared/contracts/default_ports.py): no tool imports the
        dashboard."""

        inf, wts, ext = InferenceSettings(), WeightsSettings(), ExtractorSettings()
        return cls(inference=inf.port, weights=wts.port, extractor=ext.port,
                   metrics={"inference": inf.metrics_port, "grader": GraderSettings().metrics_port,
                            "extractor": ext.metrics_port, "trainer": TrainerSettings().metrics_port,
                            "weights": wts.metrics_port}, http=inf.http_port,
                   dashboard=int(os.environ.get(DASHBOARD_PORT_VAR, DASHBOARD_PORT)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_endpoints(cls, ep: StackEndpoints) -> Ports:
        """The ports of a stack as its endpoints record names them (0 where it names none)."""
        def port(target: str) -> int:
            tail = target.rsplit(":", 1)[-1]
            return int(tail) if ":" in target and tail.isdigit() else 0   # a target without a port: none

        return cls(inference=port(ep.grpc.get("inference", "")), weights=port(ep.grpc.get("weights", "")),
                   extractor=port(ep.grpc.get("extractor", "")),
                   metrics={n: int(ep.metrics.get(n, 0)) for n in METRICS_SERVICES},
                   http=int(ep.http.get("openai", 0)), dashboard=int(ep.http.get("dashboard", 0)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ports:
        return cls(inference=int(d["inference"]), weights=int(d["weights"]), extractor=int(d["extractor"]),
                   metrics={k: int(v) for k, v in d["metrics"].items()}, http=int(d.get("http", 0)),
                   dashboard=int(d.get("dashboard", 0)))


def wire_services(ports: Ports, bind_host: str | None = "127.0.0.1") -> dict[str, dict[str, str]]:
    """Per-service environment that binds each service to `ports` (and `bind_host`; None = the services'
    own setting) and points every caller at them over loopback: inference -> weights, grader judge ->
    inference, extractor LLM -> inference, extractor consolidation -> weights, trainer -> weights."""
    inference, weights, knowledge = (f"127.0.0.1:{p}" for p in (ports.inference, ports.weights, ports.extractor))
    env = {
        "inference": {"APPRENTICE_INFERENCE_PORT": str(ports.inference),
                      "APPRENTICE_INFERENCE_HTTP_PORT": str(ports.http),
                      "APPRENTICE_INFERENCE_WEIGHTS_ENDPOINT": weights},
        "weights": {"APPRENTICE_WEIGHTS_PORT": str(ports.weights)},
        "grader": {"APPRENTICE_GRADER_INFERENCE_ENDPOINT": inference},
        "extractor": {"APPRENTICE_EXTRACTOR_PORT": str(ports.extractor),
                      "APPRENTICE_EXTRACTOR_LLM__ENDPOINT": inference, "APPRENTICE_EXTRACTOR_ENDPOINT": knowledge,
                      "APPRENTICE_EXTRACTOR_WEIGHTS_ENDPOINT": weights},
        "trainer": {"APPRENTICE_TRAINER_WEIGHTS_ENDPOINT": weights},
        "dashboard": {"APPRENTICE_DASHBOARD_PORT": str(ports.dashboard),
                      "APPRENTICE_DASHBOARD_WEIGHTS_ENDPOINT": weights,
                      "APPRENTICE_DASHBOARD_EXTRACTOR_ENDPOINT": knowledge,
                      "APPRENTICE_DASHBOARD_INFERENCE_ENDPOINT": inference,
                      "APPRENTICE_DASHBOARD_METRICS_PORTS": ",".join(f"{n}={p}" for n, p in ports.metrics.items())},
    }
    if bind_host is not None:
        env["dashboard"]["APPRENTICE_DASHBOARD_HOST"] = bind_host
        env["inference"]["APPRENTICE_INFERENCE_HOST"] = bind_host
        env["weights"]["APPRENTICE_WEIGHTS_HOST"] = bind_host
        env["extractor"]["APPRENTICE_EXTRACTOR_HOST"] = bind_host
    for name, port in ports.metrics.items():
        env[name][f"APPRENTICE_{name.upper()}_METRICS_PORT"] = str(port)
    return env


class LocalStack:
    def __init__(self, run_dir: Path, model: str, *, prefix: str | None = None,
                 service_env: dict[str, dict[str, str]] | None = None, broker: LocalBroker | None = None,
                 tenants: tuple[str, ...] = ("demo", "default"), secure: bool = True,
                 announce_in: Path | None = None) -> None:
        """`broker`: a private broker this stack starts (chaos runs stop and restart it); None = the
        configured bootstrap, started locally if nothing answers there (reused otherwise).
        `announce_in`: also record this stack's endpoints in that home (the default one, for the demo) while
        no other stack is recorded there, so the CLI finds it there without a variable.
        `secure`: authentication and TLS on, with development credentials under `<run_dir>/secrets/`
        (an operator key for this process, a service key for the services, a backend key per tenant)."""
        self.run_dir = run_dir
        self.model = model
        self.announce_in = announce_in
        self._announced = False
        self.common = CommonSettings()
        self.broker = broker
        self.bootstrap = broker.bootstrap if broker is not None else self.common.kafka_bootstrap
        self.topics = Topics(prefix if prefix is not None else f"run-{uuid.uuid4().hex[:8]}.")
        self.ports = Ports()
        env = dict(os.environ, APPRENTICE_MODEL=model, APPRENTICE_TOPIC_PREFIX=self.topics.prefix,
                   APPRENTICE_HOME=str(run_dir), APPRENTICE_KAFKA_BOOTSTRAP=self.bootstrap,
                   PYTHONUNBUFFERED="1")
        self.creds = ensure_dev_credentials(run_dir, tenants) if secure else None
        if self.creds is not None:
            env.update(self.creds.service_env())
        per_service = wire_services(self.ports)
        per_service["inference"]["APPRENTICE_INFERENCE_POD_ID"] = "pod-0"
        if self.creds is not None:  # the dashboard reads every tenant's data and acts as the operator
            per_service["dashboard"]["APPRENTICE_DASHBOARD_OPERATOR_TOKEN_FILE"] = str(self.creds.operator_token)
        for name, extra in (service_env or {}).items():
            per_service[name].update(extra)
        self.supervisor = Supervisor(run_dir, env=env, service_env=per_service)

    @property
    def client_common(self) -> CommonSettings:
        """Settings of this process as a client of the stack: verify its CA, present the operator key."""
        if self.creds is None:
            return self.common
        return self.common.model_copy(update={"tls_ca": self.creds.ca, "auth_token_file": self.creds.operator_token})

    def backend_token(self, tenant: str) -> str | None:
        """The backend key of `tenant` (created on first use; servers pick the key file up within a second)."""
        if self.creds is None:
            return None
        ensure_dev_credentials(self.run_dir, (tenant,))
        return self.creds.token(self.creds.backend_token(tenant))

    def channel(self, target: str, *, token: str | None = None, options: list[tuple[str, Any]] | None = None) -> Any:
        """A channel to one of the stack's services, as the operator (or as `token`)."""

        return open_channel(target, self.client_common, token=token, options=options or [])

    @property
    def inference_target(self) -> str:
        return f"127.0.0.1:{self.ports.inference}"

    @property
    def weights_target(self) -> str:
        return f"127.0.0.1:{self.ports.weights}"

    @property
    def knowledge_target(self) -> str:
        return f"127.0.0.1:{self.ports.extractor}"

    @property
    def dashboard_url(self) -> str:
        return f"{'https' if self.creds is not None else 'http'}://localhost:{self.ports.dashboard}/"

    def start(self) -> None:
        if self.broker is not None:
            self.broker.start()
        else:
            LocalBroker.for_settings(self.common).start()  # with SASL settings: the broker's SASL listener
        ensure_topics(self.bootstrap, self.topics)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor.start_background()
        # `APPRENTICE_HOME=<run_dir> apprentice weights list` (or status, tail, ...) then finds this stack
        recorded = self.common.model_copy(update={"kafka_bootstrap": self.bootstrap, "model": self.model,
                                                  "topic_prefix": self.topics.prefix})
        own = stack_endpoints(self.ports, recorded, ca=self.creds.ca if self.creds else None,
                              operator_token=self.creds.operator_token if self.creds else None)
        write_endpoints(self.run_dir, own)
        if self.announce_in is not None:
            self._announced = announce_endpoints(self.announce_in, replace(own, home=str(self.run_dir)))

    def health(self) -> dict[str, bool]:
        # cycle: tools/stack/cli.py imports this module
        from tools.stack.cli import service_health

        return service_health(self.ports, self.client_common)

    def wait_healthy(self, timeout: float, names: tuple[str, ...] | None = None) -> dict[str, bool]:
        """Health of every service (or of `names`) once all are healthy, or at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if names is not None:
                h = {n: h[n] for n in names}
            if all(h.values()) or time.monotonic() >= deadline:
                return h
            time.sleep(1)

    def crashed(self) -> dict[str, list[int]]:
        return {c.name: c.exits for c in self.supervisor.children if c.exits}

    def stop(self, grace: float = 20.0) -> None:
        """Stop every service (SIGTERM, then SIGKILL after `grace` seconds each)."""

        self.supervisor.stop(grace)
        remove_endpoints(self.run_dir, os.getpid())
        if self._announced and self.announce_in is not None:
            remove_endpoints(self.announce_in, os.getpid())

