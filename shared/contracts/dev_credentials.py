"""The layout of a local stack's development credentials (`<home>/secrets/`): which file holds the CA, the
server certificate, the key ring and each caller's key. tools/devca.py creates them; a service that adopts
a running stack's credentials (services/dashboard/__main__.py) finds them here without importing the tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DevCredentials:
    """Where a stack's development credentials lie under `<home>/secrets/`, and the environment that points a
    stack process or a client at them."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def keys_file(self) -> Path:
        return self.directory / "keys.txt"

    @property
    def operator_token(self) -> Path:
        return self.directory / "operator.token"

    @property
    def metrics_token(self) -> Path:
        """The scraper's key (role `metrics`): Prometheus reads the full /metrics with it and can do nothing else.
        In a folder of its own, readable by others, so a scraper running as another user can mount that folder
        alone (compose/docker-compose.yml); the 0700 secrets folder keeps it private on a host."""
        return self.directory / "scrape" / "metrics.token"

    @property
    def service_token(self) -> Path:
        return self.directory / "service.token"

    @property
    def interaction_id_secret(self) -> Path:
        return self.directory / "interaction-id.secret"

    def backend_token(self, tenant: str) -> Path:
        return self.directory / f"backend-{tenant}.token"

    def token(self, path: Path) -> str:
        return path.read_text().strip()

    def service_env(self) -> dict[str, str]:
        """Environment of a stack process: accept the ring, present the service key, TLS on."""
        return {
            "APPRENTICE_AUTH_KEYS_FILE": str(self.keys_file),
            "APPRENTICE_AUTH_TOKEN_FILE": str(self.service_token),
            "APPRENTICE_TLS_CERT": str(self.server_cert),
            "APPRENTICE_TLS_KEY": str(self.server_key),
            "APPRENTICE_TLS_CA": str(self.ca),
            "APPRENTICE_INTERACTION_ID_SECRET_FILE": str(self.interaction_id_secret),
        }

    def client_env(self, token_file: Path | None = None) -> dict[str, str]:
        """Environment of a client of the stack (CLI, tools): verify the servers, present a key
        (the operator's by default)."""
        return {"APPRENTICE_TLS_CA": str(self.ca),
                "APPRENTICE_AUTH_TOKEN_FILE": str(token_file or self.operator_token)}
