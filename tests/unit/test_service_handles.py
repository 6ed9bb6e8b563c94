"""One service skeleton (shared/service.py): every service's core object is a `ServiceHandle`, every
`__main__` runs it with `run_service`, and nothing below `__main__` installs signal handlers or starts
the metrics endpoint (so a test or the local stack can run any service in-process and stop it).

The handles are built for real (no model loaded, nothing bound: that happens in `start`) and stopped
without a start, which a handle must allow (`run_service` and the handles' own failed starts do it)."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest

from shared.service import ServiceHandle

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("inference", "weights", "extractor", "trainer", "dashboard", "grader")


def _common(tmp: Path) -> Any:
    from shared.settings import CommonSettings
    from tools.record_keys import ensure, records_dir

    ensure(records_dir(tmp))   # a service signs what it writes: its key is in its home, as `apprentice up` writes it
    return CommonSettings(model="tiny-random", home=tmp, kafka_bootstrap="127.0.0.1:1", topic_prefix="handles.")


def _inference(tmp: Path) -> Any:
    from services.inference.service import InferenceApp
    from services.inference.settings import InferenceSettings

    return InferenceApp(InferenceSettings(port=0, metrics_port=0, http_port=0, spool_dir=tmp / "spool",
                                          download_dir=tmp / "versions", common=_common(tmp)))


def _weights(tmp: Path) -> Any:
    from services.weights.service import RunningServer
    from services.weights.settings import LocalStoreSettings, WeightsSettings

    return RunningServer(WeightsSettings(port=0, metrics_port=0, store=LocalStoreSettings(dir=tmp / "store"), common=_common(tmp)),
                         consume=False)


def _extractor(tmp: Path) -> Any:
    from services.extractor.curation import approx_tokens
    from services.extractor.service import ExtractorApp
    from services.extractor.settings import ExtractorSettings
    from shared.privacy.injection_screen import InjectionScreen

    return ExtractorApp(ExtractorSettings(port=0, metrics_port=0, common=_common(tmp)),
                        count_tokens=approx_tokens, screen=InjectionScreen(()))


def _trainer(tmp: Path) -> Any:
    from services.trainer.service import TrainerApp
    from services.trainer.settings import TrainerSettings

    return TrainerApp(TrainerSettings(metrics_port=0, common=_common(tmp)))


def _dashboard(tmp: Path) -> Any:
    from services.dashboard.service import DashboardServer
    from services.dashboard.settings import DashboardSettings

    return DashboardServer(DashboardSettings(port=0, common=_common(tmp)))


def _grader(tmp: Path) -> Any:
    from services.grader.service import GraderService
    from services.grader.settings import GraderSettings
    from shared.grading import load_grader_config

    settings = GraderSettings(metrics_port=0, common=_common(tmp))
    return GraderService(settings, load_grader_config(settings.config_path))


HANDLES = {"inference": _inference, "weights": _weights, "extractor": _extractor, "trainer": _trainer,
           "dashboard": _dashboard, "grader": _grader}


@pytest.mark.parametrize("name", list(HANDLES))
def test_every_service_exposes_a_service_handle(name: str, tmp_path: Path) -> None:
    handle = HANDLES[name](tmp_path)
    assert isinstance(handle, ServiceHandle), f"{type(handle).__name__} is not a ServiceHandle"
    assert type(handle).__module__ == f"services.{name}.service", "the handle lives in the service's service.py"
    assert handle.wait(0) is False                  # not stopped before a start
    handle.stop(grace=0)          # allowed without a start, and twice
    handle.stop(grace=0)
    assert handle.exit_code == 0


GRPC_SERVICES = ("inference", "weights", "extractor")
NO_METRICS = ("dashboard",)


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_has_the_same_rooms(name: str) -> None:
    """One service shape: settings, the handle (service.py), metrics (every service but the dashboard, which
    serves no metrics endpoint), __main__, and the gRPC servicer in servicer.py exactly where the service
    serves gRPC; the handle's module defines one public class, the handle."""
    here = REPO / "services" / name
    rooms = {"settings.py", "service.py", "__main__.py"} | ({"servicer.py"} if name in GRPC_SERVICES else set())
    rooms |= set() if name in NO_METRICS else {"metrics.py"}
    assert rooms <= {p.name for p in here.iterdir()}, f"services/{name} lacks {sorted(rooms - set(os.listdir(here)))}"
    assert (here / "servicer.py").exists() == (name in GRPC_SERVICES)
    tree = ast.parse((here / "service.py").read_text())
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
    assert len(classes) == 1, f"services/{name}/service.py defines {classes}: the handle alone belongs there"


def test_an_object_missing_a_part_of_the_handle_is_not_one() -> None:
    class NoExitCode:
        def start(self) -> None: ...
        def wait(self, timeout: float | None = None) -> bool: return True
        def stop(self, grace: float | None = None) -> None: ...

    assert not isinstance(NoExitCode(), ServiceHandle)


def _calls(path: Path) -> set[str]:
    """Dotted names of everything `path` calls (`signal.signal`, `run_service`, ...)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            parts = []
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            names.add(".".join(reversed(parts)))
    return names


@pytest.mark.parametrize("name", SERVICES)
def test_main_alone_owns_signals_and_metrics(name: str) -> None:
    main = REPO / "services" / name / "__main__.py"
    assert "run_service" in _calls(main), f"{main} does not call run_service"
    for path in sorted((REPO / "services" / name).rglob("*.py")):
        owned = _calls(path) & {"signal.signal", "start_metrics_server", "loop.add_signal_handler"}
        assert not owned, f"{path.relative_to(REPO)} calls {sorted(owned)}: only run_service (from __main__) may"


def test_a_services_metrics_are_defined_in_its_metrics_py() -> None:
    """`services/<name>/metrics.py` holds every Prometheus metric of the service: no other module of a
    service imports prometheus_client (shared/ modules define the metrics of what they do themselves)."""
    stray = []
    for path in sorted((REPO / "services").rglob("*.py")):
        if path.name == "metrics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "prometheus_client" for n in names):
                stray.append(str(path.relative_to(REPO)))
    assert not stray, f"metrics defined outside metrics.py: {stray}"
