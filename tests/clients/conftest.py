"""Fixtures of the client tests: a secured inference server (keys, TLS, the tiny real model, the real
broker, the HTTP API on), the light client installed in a fresh virtual environment, and the Go stubs
generated into a module. Each is built once per session and reused by the codegen, client and example
tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc_tools
import pytest

from shared.contracts.topics import Topics
from tests.helpers.ports import free_port
from tests.security.harness import SECURITY_VARS
from tools.devca import DevCredentials, ensure_dev_credentials

REPO = Path(__file__).resolve().parents[2]
PROTOS = REPO / "protos"
WELL_KNOWN = Path(grpc_tools.__file__).parent / "_proto"
"""google/protobuf/*.proto, bundled with grpcio-tools (protoc's own include folder)."""
GO_MODULE = "github.com/apprentice-llm/apprentice/clients/go"
"""The `go_package` of protos/apprentice/v1/*.proto without its `/apprentice/v1` tail."""
GO_PLUGINS = {"protoc-gen-go": "google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12",
              "protoc-gen-go-grpc": "google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2"}
GO_REQUIRES = {"google.golang.org/grpc": "v1.85.0", "google.golang.org/protobuf": "v1.36.12"}
TENANT = "acme"


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a tool; on failure, fail the test with its output (not a bare CalledProcessError)."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
                    f"--- stderr\n{proc.stderr[-4000:]}")
    return proc


def protoc_version() -> str:
    """The protoc bundled with grpcio-tools, e.g. "35.1" (it prints `libprotoc 35.1`)."""
    return run([sys.executable, "-m", "grpc_tools.protoc", "--version"]).stdout.split()[-1]


def proto_files() -> list[str]:
    return sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))


# --- the server -----------------------------------------------------------------------------------
@dataclass
class Server:
    """The secured inference server and what a product backend needs to reach it."""

    app: Any
    creds: DevCredentials
    topics: Topics
    bootstrap: str

    @property
    def grpc_target(self) -> str:
        return f"localhost:{self.app.port}"     # the dev certificate names localhost and 127.0.0.1

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self.app.http_port}/v1"

    def key(self, tenant: str = TENANT) -> str:
        return self.creds.token(self.creds.backend_token(tenant))

    def example_env(self, tenant: str = TENANT) -> dict[str, str]:
        """What the examples read (examples/README.md): target, base URL, CA, backend key."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_")}
        env.update(APPRENTICE_TARGET=self.grpc_target, APPRENTICE_BASE_URL=self.base_url,
                   APPRENTICE_CA=str(self.creds.ca), APPRENTICE_API_KEY=self.key(tenant))
        return env


@pytest.fixture(scope="session")
def server(kafka_bootstrap: str, tiny_model_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Keys (operator, services, backends of acme and globex), TLS with the dev CA's server certificate,
    signed interaction ids, the HTTP API on: the way `apprentice up` runs the service."""
    from shared.kafka.admin import delete_topics, ensure_topics
    from tests.helpers.inference import start_inference

    home = tmp_path_factory.mktemp("clients")
    creds = ensure_dev_credentials(home, tenants=(TENANT, "globex"))
    topics = Topics(prefix=f"test-clients-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, topics)
    with pytest.MonkeyPatch.context() as mp:
        for name in SECURITY_VARS:
            mp.delenv(name, raising=False)
        mp.setenv("APPRENTICE_AUTH_KEYS_FILE", str(creds.keys_file))
        mp.setenv("APPRENTICE_TLS_CERT", str(creds.server_cert))
        mp.setenv("APPRENTICE_TLS_KEY", str(creds.server_key))
        mp.setenv("APPRENTICE_INTERACTION_ID_SECRET_FILE", str(creds.interaction_id_secret))
        # the settings are read here; the environment is restored at once, so tests that run while this
        # long-lived server is up do not inherit its keys and TLS
        app = start_inference(home, model=tiny_model_name, bootstrap=kafka_bootstrap, topic_prefix=topics.prefix,
                              http_port=free_port(), follow_updates=False, heartbeat_interval_s=0)
    try:
        yield Server(app, creds, topics, kafka_bootstrap)
    finally:
        app.stop(2)
        with contextlib.suppress(Exception):
            delete_topics(kafka_bootstrap, [s.name for s in topics.specs()])


# --- the light client in a fresh venv -------------------------------------------------------------
@dataclass
class ClientVenv:
    python: Path
    wheel: Path


@pytest.fixture(scope="session")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> ClientVenv:
    """`pip wheel clients/python`, then a fresh venv with grpcio, protobuf and that wheel only (PyPI). The
    wheel is built from a copy: an in-tree build would leave a `build/` folder whose stale files a later
    wheel could pick up."""
    tmp = tmp_path_factory.mktemp("client-venv")
    source = tmp / "src"
    shutil.copytree(REPO / "clients" / "python", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(tmp / "dist")])
    wheels = list((tmp / "dist").glob("apprentice_client-*.whl"))
    assert len(wheels) == 1, wheels
    run([sys.executable, "-m", "venv", str(tmp / "venv")])
    python = tmp / "venv" / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "grpcio", "protobuf",
         str(wheels[0])])
    return ClientVenv(python, wheels[0])


# --- Go -------------------------------------------------------------------------------------------
@dataclass
class GoStubs:
    module: Path      # a Go module named GO_MODULE holding the generated apprentice/v1 package
    env: dict[str, str]


def go_env(gobin: Path) -> dict[str, str]:
    """The Go module cache stays where it is (reused between runs); plugins go to a temp GOBIN."""
    return {**os.environ, "GOBIN": str(gobin), "PATH": f"{gobin}{os.pathsep}{os.environ.get('PATH', '')}",
            "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}


@pytest.fixture(scope="session")
def go_stubs(tmp_path_factory: pytest.TempPathFactory) -> GoStubs:
    """protoc-gen-go and protoc-gen-go-grpc from the Go module proxy, the stubs of every .proto generated
    with grpcio-tools' protoc into a module named after `go_package`."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain (`go`) on PATH")
    tmp = tmp_path_factory.mktemp("go")
    env = go_env(tmp / "bin")
    for plugin in GO_PLUGINS.values():
        run(["go", "install", plugin], env=env, cwd=tmp)
    module = tmp / "clients" / "go"
    module.mkdir(parents=True)
    run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"-I{WELL_KNOWN}",
         f"--plugin=protoc-gen-go={tmp / 'bin' / 'protoc-gen-go'}",
         f"--plugin=protoc-gen-go-grpc={tmp / 'bin' / 'protoc-gen-go-grpc'}",
         f"--go_out={module}", f"--go_opt=module={GO_MODULE}",
         f"--go-grpc_out={module}", f"--go-grpc_opt=module={GO_MODULE}", *proto_files()])
    requires = "\n".join(f"\t{m} {v}" for m, v in GO_REQUIRES.items())
    (module / "go.mod").write_text(f"module {GO_MODULE}\n\ngo 1.24\n\nrequire (\n{requires}\n)\n")
    run(["go", "mod", "tidy"], cwd=module, env=env)
    return GoStubs(module, env)
