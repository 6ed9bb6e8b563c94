"""Which address a server may bind, given whether it authenticates callers.

A server without keys is for one developer's machine: it binds loopback. Exposing it beyond loopback
would let anyone who reaches the port promote models and read every tenant's data, so that needs the
explicit `APPRENTICE_INSECURE=true`.
"""

from __future__ import annotations

import ipaddress
import logging

log = logging.getLogger(__name__)

AUTO = ""
"""The default host: every interface when keys are configured, loopback when not."""


class InsecureBind(ValueError):
    """A non-loopback bind without authentication was asked for and not explicitly allowed."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_bind_host(host: str, *, authenticated: bool, insecure: bool, what: str = "server") -> str:
    """The address to bind. Raises InsecureBind for a non-loopback host without keys unless `insecure`."""
    if host == AUTO:
        host = "0.0.0.0" if authenticated else "127.0.0.1"
    if not authenticated:
        if not is_loopback(host):
            if not insecure:
                raise InsecureBind(
                    f"{what}: refusing to bind {host} without authentication; configure keys "
                    f"(APPRENTICE_AUTH_KEYS or APPRENTICE_AUTH_KEYS_FILE), bind 127.0.0.1, or set "
                    f"APPRENTICE_INSECURE=true for an isolated network")
            log.warning("%s: UNAUTHENTICATED on %s (APPRENTICE_INSECURE=true): anyone who reaches it "
                        "can act as an operator", what, host)
        else:
            log.warning("%s: no keys configured, unauthenticated and bound to loopback %s", what, host)
    return host
