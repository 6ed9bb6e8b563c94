"""The default ports of the contract (shared/contracts/default_ports.py), which the dashboard and the tools
dial without importing a service, are the ports the services' own settings bind by default; and
`apprentice up` (tools/stack) moves the dashboard by the variable the dashboard's settings read."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from shared.contracts.default_ports import DASHBOARD_PORT, DASHBOARD_PORT_VAR, GRPC_PORTS, METRICS_PORTS


def settings_class(service: str) -> Any:
    module = importlib.import_module(f"services.{service}.settings")
    return next(v for k, v in vars(module).items() if k.lower() == f"{service}settings")


@pytest.mark.parametrize("service", sorted(GRPC_PORTS))
def test_grpc_ports_are_the_services_defaults(service: str) -> None:
    assert settings_class(service).model_fields["port"].default == GRPC_PORTS[service]


@pytest.mark.parametrize("service", sorted(METRICS_PORTS))
def test_metrics_ports_are_the_services_defaults(service: str) -> None:
    assert settings_class(service).model_fields["metrics_port"].default == METRICS_PORTS[service]


def test_the_dashboard_port_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.dashboard.settings import DashboardSettings
    from tools.stack.ports import Ports

    monkeypatch.delenv(DASHBOARD_PORT_VAR, raising=False)
    assert DashboardSettings().port == DASHBOARD_PORT == Ports.configured().dashboard
    monkeypatch.setenv(DASHBOARD_PORT_VAR, "18080")
    assert DashboardSettings().port == 18080 == Ports.configured().dashboard
