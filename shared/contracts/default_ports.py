"""The ports the services bind unless told otherwise (docs/architecture.md §2): what a reader that finds
no running stack's record (shared/contracts/stack_endpoints.py) dials, and what `apprentice up` binds.

Each service's settings carry the same numbers as their defaults; tests/unit/shared/test_default_ports.py
checks that they agree, so the dashboard and the tools can use them without importing a service.
"""

from __future__ import annotations

GRPC_PORTS = {"inference": 50051, "weights": 50052, "extractor": 50053}
"""The gRPC services' ports (`APPRENTICE_<SERVICE>_PORT`)."""

METRICS_PORTS = {"inference": 9101, "grader": 9102, "extractor": 9103, "trainer": 9104, "weights": 9105}
"""Each service's Prometheus endpoint (`APPRENTICE_<SERVICE>_METRICS_PORT`); the dashboard serves none."""

DASHBOARD_PORT = 8080
DASHBOARD_PORT_VAR = "APPRENTICE_DASHBOARD_PORT"
"""The operator dashboard's HTTP port, and the variable that moves it."""
