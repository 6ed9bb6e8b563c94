"""`apprentice dashboard` (also `apprentice serve dashboard`): serve the operator dashboard until SIGTERM/SIGINT.

The dashboard has no metrics endpoint of its own (it reads the other services'), so it runs with
`metrics_port=0`."""

from __future__ import annotations

import argparse
import os
from collections.abc import MutableMapping

from services.dashboard.settings import DashboardSettings
from shared.contracts.dev_credentials import DevCredentials
from shared.kafka.authorization import check_access_at_start
from shared.logs import configure_logging
from shared.service import run_service
from shared.settings import default_home
from shared.startup import exit_on_startup_error


def adopt_stack_credentials(environ: MutableMapping[str, str]) -> None:
    """Next to a stack that runs with development credentials (`apprentice up`) and without keys of the
    user's own: accept the stack's operator key, serve HTTPS with its certificate, and read as its
    operator, as the services of that stack do. A variable that is set stays."""
    if environ.get("APPRENTICE_AUTH_KEYS") or environ.get("APPRENTICE_AUTH_KEYS_FILE"):
        return

    creds = DevCredentials(default_home() / "secrets")
    if not (creds.keys_file.exists() and creds.server_cert.exists() and creds.operator_token.exists()):
        return
    environ["APPRENTICE_AUTH_KEYS_FILE"] = str(creds.keys_file)
    environ.setdefault("APPRENTICE_TLS_CERT", str(creds.server_cert))
    environ.setdefault("APPRENTICE_TLS_KEY", str(creds.server_key))
    environ.setdefault("APPRENTICE_DASHBOARD_OPERATOR_TOKEN_FILE", str(creds.operator_token))


@exit_on_startup_error("dashboard")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apprentice dashboard", description=__doc__)
    ap.add_argument("--port", type=int, help="HTTP port (default: APPRENTICE_DASHBOARD_PORT or 8080)")
    ap.add_argument("--host", help="interface to bind (default: APPRENTICE_DASHBOARD_HOST; loopback without keys)")
    ns = ap.parse_args(argv)
    adopt_stack_credentials(os.environ)

    settings = DashboardSettings(**{k: v for k, v in (("port", ns.port), ("host", ns.host)) if v is not None})
    configure_logging("dashboard", settings.common.log_level, settings.common.log_json)
    # what the access table grants its principal, asked of the broker: a missing ACL is one line, exit 2
    check_access_at_start(settings.common)
    # deferred: the server (its Kafka readers, page renderer) loads only to run; `apprentice` imports this module
    from services.dashboard.service import DashboardServer

    return run_service(DashboardServer(settings), metrics_port=0)


if __name__ == "__main__":
    raise SystemExit(main())
