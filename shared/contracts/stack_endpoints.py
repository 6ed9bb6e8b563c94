"""Where a running stack listens, recorded in its home so that every `apprentice` command finds it.

`apprentice up` (and every private stack: demo, end-to-end tests) may bind other ports than the
defaults, another broker or a topic prefix. It writes them to `<home>/endpoints.json`; a CLI command
that is given no explicit flag or variable reads them from there instead of dialling the defaults
(which would reach nothing, or worse another stack). Explicit settings always win: the recorded values
only fill the `APPRENTICE_*` variables that are unset.

The record names its supervisor's pid: a record whose supervisor is gone (a crash, a reboot) is stale and
ignored, so a dead stack never redirects the CLI. A private stack (the demo's, under `<home>/demo/<run>/`)
also announces itself in the default home while no other stack is recorded there, with `home` naming its
own folder, so that `apprentice status`, `weights list`, `tail`, ... find it during `make demo` without a
variable; it withdraws the announcement when it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENDPOINTS_FILE = "endpoints.json"

GRPC_TARGET_VARS = {"weights": "APPRENTICE_WEIGHTS_ENDPOINT", "extractor": "APPRENTICE_EXTRACTOR_ENDPOINT",
                    "inference": "APPRENTICE_TARGET"}
"""The variable each client reads for a service's gRPC target (the weights and knowledge CLIs, examples)."""

DEPRECATED_CLIENT_VARS = {"APPRENTICE_EXTRACTOR_ENDPOINT": "APPRENTICE_EXTRACTOR_TARGET"}
"""Old names of client variables (still read, shared/settings.py `renamed_env`): one the user set still wins
over the stack's record."""


@dataclass(frozen=True)
class StackEndpoints:
    supervisor_pid: int
    kafka_bootstrap: str
    topic_prefix: str = ""
    model: str = ""
    grpc: dict[str, str] = field(default_factory=dict)
    """service -> host:port of its gRPC server (inference, weights, extractor)."""
    metrics: dict[str, int] = field(default_factory=dict)
    """service -> port of its Prometheus `/metrics` endpoint."""
    http: dict[str, int] = field(default_factory=dict)
    """HTTP servers by name: `openai` (the inference pod's OpenAI-compatible API), `dashboard`, ..."""
    tls_ca: str | None = None
    """The CA that signed the servers' certificates (None: the stack runs without TLS)."""
    operator_token: str | None = None
    """File holding the stack's operator key (None: no development keys)."""
    home: str = ""
    """The folder holding the stack's own state (stack.json, logs) when it is not the folder of this record
    (a private stack announced in the default home); "" = this record's folder."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StackEndpoints:
        """Parse a record strictly: ValueError for anything but the shape `as_dict` writes (a record is read
        by every CLI command, so a broken or planted one must be ignored, not crash or half-apply)."""
        def text(v: Any, what: str) -> str:
            if not isinstance(v, str) or len(v) > 4096:
                raise ValueError(f"{what} must be a string")
            return v

        def port(v: Any, what: str) -> int:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
                raise ValueError(f"{what} must be a port number")
            return v

        def table(v: Any, what: str) -> dict[str, Any]:
            if v is None:
                return {}
            if not isinstance(v, dict):
                raise ValueError(f"{what} must be an object")
            return v

        pid = d["supervisor_pid"]
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2 ** 31:
            raise ValueError("supervisor_pid must be a process id")
        optional = {k: (None if d.get(k) is None else text(d[k], k)) for k in ("tls_ca", "operator_token")}
        return cls(supervisor_pid=pid, kafka_bootstrap=text(d["kafka_bootstrap"], "kafka_bootstrap"),
                   topic_prefix=text(d.get("topic_prefix", ""), "topic_prefix"),
                   model=text(d.get("model", ""), "model"),
                   grpc={text(k, "grpc"): text(v, f"grpc.{k}") for k, v in table(d.get("grpc"), "grpc").items()},
                   metrics={text(k, "metrics"): port(v, f"metrics.{k}")
                            for k, v in table(d.get("metrics"), "metrics").items()},
                   http={text(k, "http"): port(v, f"http.{k}") for k, v in table(d.get("http"), "http").items()},
                   tls_ca=optional["tls_ca"], operator_token=optional["operator_token"],
                   home=text(d.get("home", ""), "home"))

    def client_env(self) -> dict[str, str]:
        """The `APPRENTICE_*` variables a client of this stack uses."""
        env = {"APPRENTICE_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "APPRENTICE_TOPIC_PREFIX": self.topic_prefix}
        if self.model:
            env["APPRENTICE_MODEL"] = self.model
        for service, var in GRPC_TARGET_VARS.items():
            if service in self.grpc:
                env[var] = self.grpc[service]
        if self.tls_ca:
            env["APPRENTICE_TLS_CA"] = self.tls_ca
        if self.operator_token:
            env["APPRENTICE_AUTH_TOKEN_FILE"] = self.operator_token
        return env


def endpoints_path(home: Path) -> Path:
    return home / ENDPOINTS_FILE


def write_endpoints(home: Path, endpoints: StackEndpoints) -> Path:
    """Record `endpoints` atomically (a reader never sees half a file)."""
    path = endpoints_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(endpoints.as_dict(), indent=1))
    os.chmod(tmp, 0o644)     # readable by the user's tools, writable by no one else (`_trusted`)
    tmp.replace(path)
    return path


def remove_endpoints(home: Path, supervisor_pid: int | None = None) -> None:
    """Forget the record (on stop); only our own when `supervisor_pid` is given."""
    path = endpoints_path(home)
    if supervisor_pid is not None:
        current = read_endpoints(home, live_only=False)
        if current is not None and current.supervisor_pid != supervisor_pid:
            return
    path.unlink(missing_ok=True)


def _trusted(path: Path) -> bool:
    """Whether a record may steer this process: a file of this user (or root's), that nobody else may write.
    The record names the CA to trust and the key file to present; one planted by another user would send
    this user's operator key to a server of theirs."""
    st = path.stat()
    return st.st_uid in (os.getuid(), 0) and not st.st_mode & 0o022


def process_alive(pid: int) -> bool:
    """Whether `pid` runs. A process this very one started and that has exited is a zombie until reaped, and
    `kill(pid, 0)` still answers for a zombie: it is reaped here, or recognised in /proc."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers kill(pid, 0) too
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def read_endpoints(home: Path, *, live_only: bool = True) -> StackEndpoints | None:
    """The recorded endpoints of the stack under `home`; None when there is none, it does not parse, or
    (with `live_only`) its supervisor is gone."""
    path = endpoints_path(home)
    try:
        if not _trusted(path):
            return None
        endpoints = StackEndpoints.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if live_only and not process_alive(endpoints.supervisor_pid):
        return None
    return endpoints


def announce_endpoints(home: Path, endpoints: StackEndpoints) -> bool:
    """Record a private stack in `home` too (with `home` set to its own folder) unless a live stack is
    recorded there already; whether it was recorded."""
    if read_endpoints(home) is not None:
        return False
    write_endpoints(home, endpoints)
    return True


def state_home(home: Path) -> Path:
    """Where the state of the stack recorded in `home` lives: its announced folder, else `home` itself."""
    endpoints = read_endpoints(home)
    return Path(endpoints.home) if endpoints is not None and endpoints.home else home


def apply_stack_endpoints(home: Path, environ: MutableMapping[str, str] | None = None) -> StackEndpoints | None:
    """Make this process a client of the running stack under `home`: fill every unset `APPRENTICE_*`
    client variable from its record. A variable that is set (even to "") is the user's and stays; the
    operator key is not filled when a key is given either way (`APPRENTICE_AUTH_TOKEN`)."""
    env = os.environ if environ is None else environ
    endpoints = read_endpoints(home)
    if endpoints is None:
        return None
    for name, value in endpoints.client_env().items():
        if name == "APPRENTICE_AUTH_TOKEN_FILE" and env.get("APPRENTICE_AUTH_TOKEN"):
            continue
        if name in DEPRECATED_CLIENT_VARS and DEPRECATED_CLIENT_VARS[name] in env:
            continue
        env.setdefault(name, value)
    return endpoints
