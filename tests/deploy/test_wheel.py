"""The wheel the image installs runs every service by itself, without the source tree beside it.

compose/Dockerfile builds the `apprentice` wheel from what its COPY lines put in the build context and
installs it (`pip install .`); the services then run from site-packages. A run-time file that is not
package data (the dashboard's templates and static assets were not: `Directory '.../static' does not
exist`) is missing only there, while every other test runs from the checkout, where it is always present.
So this builds the wheel the way the image does, from a copy of exactly that build context, installs it
into a fresh virtual environment and starts the whole stack from it (`apprentice up`: the five services
and the dashboard as supervised processes), from a folder outside the repository.

The fresh environment takes its third-party dependencies from this suite's environment (a `.pth` line
naming its site-packages: nothing is downloaded), but not the repository: that environment's editable
install of `apprentice` is an import hook that only its own site-packages' `.pth` files activate, and a
`.pth` line adds a folder to `sys.path` without processing the `.pth` files inside it. The probe checks
that `services` and `shared` are imported from the wheel's copy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.topics import Topics
from tests.helpers.waiting import wait_for
from tools.stack.ports import Ports

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "compose" / "Dockerfile"
IGNORED = ("__pycache__", "*.pyc", "*.egg-info", "build", "dist", "node_modules")
"""What .dockerignore keeps out of the build context (and a build leaves behind in a source tree)."""
NOT_RUNTIME = {"README.md"}
"""Files under services/ and shared/ that no process reads (documentation for people)."""
SERVICES = ("weights", "inference", "grader", "extractor", "trainer", "dashboard")
DASHBOARD_PAGES = ("", "versions", "hacking", "knowledge", "health", "login")
STATIC_ASSETS = ("dashboard.css", "dashboard.js", "chart.umd.min.js", "chart.js.LICENSE.md")


def run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a build or install step; on failure, fail the test with its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{shlex.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
                    f"--- stderr\n{proc.stderr[-4000:]}")
    return proc


def docker_build_context(dest: Path) -> Path:
    """Copy what compose/Dockerfile's COPY lines take from the repository into `dest`, at the places they
    put it relative to the WORKDIR where `pip install .` runs: a file the build needs but the Dockerfile
    does not copy is missing here too. Returns the folder `pip install .` builds."""
    copies = [shlex.split(line)[1:] for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ")]
    assert copies, f"no COPY line in {DOCKERFILE}"
    for *sources, target in copies:
        assert not any(s.startswith("--") for s in sources), f"COPY flags are not handled here: {sources}"
        for source in sources:
            src, to = REPO / source, dest / target
            if src.is_dir():
                shutil.copytree(src, to, ignore=shutil.ignore_patterns(*IGNORED), dirs_exist_ok=True)
            else:
                to.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, to / src.name)
    return dest


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def runtime_files() -> set[str]:
    """Every file under services/ and shared/ that a process may read or import, as a wheel names it."""
    out = set()
    for top in ("services", "shared"):
        for p in (REPO / top).rglob("*"):
            rel = p.relative_to(REPO)
            if p.is_file() and p.name not in NOT_RUNTIME and p.suffix != ".pyc" and "__pycache__" not in rel.parts:
                out.add(rel.as_posix())
    return out


@dataclass
class WheelVenv:
    root: Path
    wheel: Path
    sdist_wheel: Path
    site_packages: Path
    env: dict[str, str]
    """The environment to run it with: no PYTHONPATH (which could name the checkout), no APPRENTICE_*
    setting of the caller's except where the broker is (and the model cache)."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def apprentice(self) -> Path:
        return self.root / "bin" / "apprentice"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """Build the wheel as the image does (and once more through an sdist, as an index would), install it
    into a fresh venv with `--no-deps`, then give that venv this environment's dependencies."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = docker_build_context(tmp / "context")
    py = sys.executable
    # an sdist first, from a clean copy, then a wheel built from that sdist alone
    sdist_dir = tmp / "sdist"
    run([py, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(sdist_dir)!r})"], cwd=src)
    sdists = list(sdist_dir.glob("apprentice-*.tar.gz"))
    assert len(sdists) == 1, sdists
    run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--disable-pip-version-check", "-w", str(tmp / "from-sdist"), str(sdists[0])], cwd=tmp)
    # the image's build: `pip install .` in the build context (the same wheel `pip wheel .` makes)
    shutil.rmtree(src / "build", ignore_errors=True)
    run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--disable-pip-version-check", "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    (wheel,), (sdist_wheel,) = (list((tmp / d).glob("apprentice-*.whl")) for d in ("dist", "from-sdist"))

    venv = tmp / "venv"
    run([py, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    # installed before the .pth exists: pip then sees no other `apprentice` (the editable one) to replace
    run([py, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
         "--disable-pip-version-check", str(wheel)], cwd=tmp)
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=tmp).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_apprentice_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))

    keep = ("APPRENTICE_KAFKA_", "APPRENTICE_MODEL_CACHE", "APPRENTICE_TOPIC_PREFIX")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and (not k.startswith("APPRENTICE_")
                                                                      or k.startswith(keep))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return WheelVenv(venv, wheel, sdist_wheel, site, env)


PROBE = """
import importlib.metadata, json, sys
import services, shared
from services.dashboard import web as dashboard
from services.grader.settings import DEFAULT_CONFIG
from tools.tasks.task import TASKS_DIR, load_task
from services.weights.evalset import _packaged_dir
from tools.broker.local_broker import POM
from shared.proto.apprentice.v1 import (common_pb2, events_pb2, inference_pb2, inference_pb2_grpc, knowledge_pb2,
                                        knowledge_pb2_grpc, weights_pb2, weights_pb2_grpc)
print(json.dumps({
    "services": services.__file__, "shared": shared.__file__, "proto": events_pb2.__file__,
    "dist": str(importlib.metadata.distribution("apprentice").locate_file("")),
    "version": importlib.metadata.version("apprentice"),
    "client": importlib.util.find_spec("apprentice_client") is not None,
    "files": {
        "dashboard templates": [p.name for p in (dashboard.HERE / "templates").glob("*.html")],
        "dashboard static": [p.name for p in (dashboard.HERE / "static").iterdir()],
        "grader default config": [DEFAULT_CONFIG.name] if DEFAULT_CONFIG.is_file() else [],
        "tasks": [p.name for p in TASKS_DIR.glob("*.yaml")],
        "eval sets": [p.name for p in _packaged_dir().glob("*.yaml")],
        "kafka pom": [POM.name] if POM.is_file() else [],
    },
    "task": load_task("support_desk").name,
}))
"""


def test_wheel_holds_every_runtime_file(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    """Every file under services/ and shared/ but the READMEs is in the wheel (so none is forgotten when
    one is added), the sdist rebuilds the same wheel, and the installed copy finds its own files through
    the paths the code uses, from a folder outside the repository."""
    in_wheel = wheel_files(wheel_venv.wheel)
    missing = sorted(runtime_files() - in_wheel)
    assert not missing, f"not in the wheel (make them package data in pyproject.toml): {missing}"
    assert wheel_files(wheel_venv.sdist_wheel) == in_wheel, "the sdist's wheel differs from the direct build"

    out = json.loads(run([str(wheel_venv.python), "-c", PROBE], cwd=tmp_path, env=wheel_venv.env).stdout)
    for key in ("services", "shared", "proto", "dist"):
        assert Path(out[key]).is_relative_to(wheel_venv.site_packages), (key, out[key])
    assert out["version"] == "0.1.0" and out["task"] == "support_desk"
    assert not out["client"], "the checkout's editable apprentice-client leaked into the fresh venv"
    files = out["files"]
    assert set(files["dashboard templates"]) == {p.name for p in (REPO / "services/dashboard/templates").iterdir()}
    assert set(files["dashboard static"]) == {p.name for p in (REPO / "services/dashboard/static").iterdir()}
    assert files["grader default config"] and files["kafka pom"], files
    assert set(files["tasks"]) == {p.name for p in (REPO / "tools/tasks").glob("*.yaml")}
    assert set(files["eval sets"]) == {p.name for p in (REPO / "services/weights/evalsets").glob("*.yaml")}


# --- the whole stack from the wheel ------------------------------------------------------------------
def _state(home: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((home / "stack.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _log_tail(home: Path, name: str, n: int = 3000) -> str:
    log = home / "logs" / f"{name}.log"
    return f"--- {log}\n{log.read_text(errors='replace')[-n:]}" if log.exists() else f"(no {log})"


@pytest.fixture
def stack_from_wheel(wheel_venv: WheelVenv, kafka_bootstrap: str, topics: Topics, tiny_model_name: str,
                     tmp_path: Path) -> Iterator[tuple[Path, Ports]]:
    """`apprentice up` of the fresh venv (tiny model, the suite's broker, this test's topics, free ports,
    its own APPRENTICE_HOME and development keys), run from a folder outside the repository; `down` after."""
    ports, home, cwd = Ports(), tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    env = {**wheel_venv.env, "APPRENTICE_HOME": str(home), "APPRENTICE_MODEL": tiny_model_name,
           "APPRENTICE_USE_RUNNING_BROKER": "1",   # the suite's broker is not this home's: share it
           "APPRENTICE_KAFKA_BOOTSTRAP": kafka_bootstrap, "APPRENTICE_TOPIC_PREFIX": topics.prefix,
           "APPRENTICE_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "APPRENTICE_INFERENCE_PORT": str(ports.inference), "APPRENTICE_WEIGHTS_PORT": str(ports.weights),
           "APPRENTICE_EXTRACTOR_PORT": str(ports.extractor), "APPRENTICE_INFERENCE_HTTP_PORT": str(ports.http),
           "APPRENTICE_DASHBOARD_PORT": str(ports.dashboard),
           **{f"APPRENTICE_{n.upper()}_METRICS_PORT": str(p) for n, p in ports.metrics.items()}}

    def apprentice(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(wheel_venv.apprentice), *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)

    try:
        up = apprentice("up", "--wait", "240", timeout=300)
        logs = "\n".join(_log_tail(home, n) for n in SERVICES)
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{logs}"
        yield home, ports
    finally:
        down = apprentice("down", timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr


def _get(url: str, ctx: ssl.SSLContext, token: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return int(r.status), r.read()


def test_every_service_starts_from_the_wheel(wheel_venv: WheelVenv, stack_from_wheel: tuple[Path, Ports]) -> None:
    """`apprentice up` of the installed wheel: the five services report healthy (up's own wait: gRPC health,
    metrics endpoints), every process of the stack (the dashboard's too) is the fresh venv's interpreter,
    and the dashboard serves each page and each static asset its pages load, byte for byte."""
    home, ports = stack_from_wheel
    url = f"https://localhost:{ports.dashboard}/"
    ctx = ssl.create_default_context(cafile=str(home / "secrets" / "ca.pem"))
    token = (home / "secrets" / "operator.token").read_text().strip()

    def dashboard_up() -> bool:
        exits = _state(home).get("services", {}).get("dashboard", {}).get("exits")
        assert not exits, f"the dashboard exited {exits}\n{_log_tail(home, 'dashboard')}"
        try:
            return _get(url + "login", ctx, token)[0] == 200
        except OSError:
            return False

    wait_for(dashboard_up, what="the dashboard answering", stall_s=90, every=0.5,
             detail=lambda: _log_tail(home, "dashboard"))

    services = _state(home)["services"]
    assert set(services) == set(SERVICES), services
    for name, s in services.items():
        assert s["pid"] and s["restarts"] == 0 and not s["exits"], (name, s, _log_tail(home, name))
        argv = Path(f"/proc/{s['pid']}/cmdline").read_bytes().split(b"\0")[:-1]
        assert [a.decode() for a in argv] == [str(wheel_venv.python), "-m", "tools.cli.main", "serve", name]
        assert not Path(os.readlink(f"/proc/{s['pid']}/cwd")).is_relative_to(REPO)

    assets: set[str] = set()
    for page in DASHBOARD_PAGES:
        status, body = _get(url + page, ctx, token)
        assert status == 200 and b"</html>" in body, (page, status, body[:300])
        assets |= set(re.findall(r'(?:src|href)="/static/([^"]+)"', body.decode()))
    assert {"dashboard.css", "dashboard.js", "chart.umd.min.js"} <= assets, assets
    for asset in sorted(assets | set(STATIC_ASSETS)):
        status, body = _get(f"{url}static/{asset}", ctx, token)
        assert status == 200 and body and body == (REPO / "services/dashboard/static" / asset).read_bytes(), asset
