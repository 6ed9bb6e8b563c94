"""A running local stack, seen from outside: the ports it was started with and whether each service answers.

Used by `apprentice status` and `apprentice env` (cli.py, client_env.py) and by private stacks waiting for
health (stack.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.contracts.stack_endpoints import read_endpoints
from shared.metrics import scrape
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from tools.stack.ports import Ports


def stack_state(home: Path) -> dict[str, Any]:
    """The supervisor's `stack.json` (pids, restarts, ports), or {} when no stack was started here."""
    try:
        return dict(json.loads((home / "stack.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def stack_ports(home: Path) -> Ports:
    """The ports the running stack was started with: recorded in stack.json by `up`'s supervisor, else in
    the endpoints record every stack writes (a private stack's), else the configured ones."""
    recorded = stack_state(home).get("ports")
    if recorded:
        return Ports.from_dict(recorded)

    endpoints = read_endpoints(home)
    return Ports.from_endpoints(endpoints) if endpoints is not None else Ports.configured()


def grpc_healthy(port: int, common: CommonSettings | None = None) -> bool:
    try:
        with open_channel(f"127.0.0.1:{port}", common) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
            return resp.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def metrics_text(port: int) -> str | None:
    return scrape(f"127.0.0.1:{port}")


def service_health(ports: Ports, common: CommonSettings | None = None) -> dict[str, bool]:
    """gRPC health for the three gRPC services; a metrics endpoint that answers for grader and trainer
    (they serve no gRPC). `common`: the client settings (TLS CA) to dial with."""
    return {"inference": grpc_healthy(ports.inference, common),
            "grader": metrics_text(ports.metrics["grader"]) is not None,
            "extractor": grpc_healthy(ports.extractor, common),
            "trainer": metrics_text(ports.metrics["trainer"]) is not None,
            "weights": grpc_healthy(ports.weights, common)}
