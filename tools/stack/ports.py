"""Where each service of a local stack listens, and the environment that wires them together.

Shared by `apprentice up` (tools/stack/cli.py, supervisor.py) and private stacks (stack.py), so the wiring
between services (who calls whom on which port) is written once.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.extractor.settings import ExtractorSettings
from services.grader.settings import GraderSettings
from services.inference.settings import InferenceSettings
from services.trainer.settings import TrainerSettings
from services.weights.settings import WeightsSettings
from shared.contracts.default_ports import DASHBOARD_PORT, DASHBOARD_PORT_VAR
from shared.contracts.stack_endpoints import StackEndpoints

METRICS_SERVICES = ("inference", "grader", "extractor", "trainer", "weights")


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux: 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def reserve(*ports: int) -> None:
    """Never hand out `ports` (a server of this process binds them later: a private broker's)."""
    _HANDED_OUT.update(ports)


def _first_port(low: int) -> int:
    """Where the ports this module picks start: above the fixed ports some tests bind (19092-21092) when the
    range below `low` leaves room for that."""
    return 22000 if low > 23000 else 1024


def below_ephemeral(span: int) -> int:
    """A random even base port such that `base .. base + span` lies below the kernel's range for outgoing
    connections (a port there can be taken by any client while its server is down, as a restarted broker
    found: "Address already in use"), and holds no port this process handed out already."""
    low = _ephemeral_low()
    bases = range(_first_port(low), low - span, 2)
    start = random.randrange(len(bases))              # from a random place, every base once
    for base in (bases[(start + i) % len(bases)] for i in range(len(bases))):
        if _HANDED_OUT.isdisjoint(range(base, base + span + 1)):
            return base
    raise RuntimeError(f"no {span + 1} ports below {low} that this process has not handed out")


def free_port() -> int:
    """A port that is free now and stays free until a service binds it: chosen below the kernel's range for
    outgoing connections (a port picked there can be taken by any client's connection, e.g. a Kafka client of
    the same stack, before its service binds it: seen once as "cannot bind the metrics port"), and never
    one this process handed out already."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(_first_port(low), low)
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


def wire_services(ports: Ports, bind_host: str | None = "127.0.0.1", *, inference_target: str = "",
                  weights_target: str = "") -> dict[str, dict[str, str]]:
    """Per-service environment that binds each service to `ports` (and `bind_host`; None = the services'
    own setting) and points every caller at them over loopback: inference -> weights, grader judge ->
    inference, extractor LLM -> inference, extractor consolidation -> weights, trainer -> weights.
    `inference_target` / `weights_target`: what callers dial instead, when the service has replicas
    (`shared.security.channels.replica_target`)."""
    inference, weights, knowledge = (f"127.0.0.1:{p}" for p in (ports.inference, ports.weights, ports.extractor))
    inference, weights = inference_target or inference, weights_target or weights
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
