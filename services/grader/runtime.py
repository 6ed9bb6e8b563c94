"""GraderSettings + GraderConfig --> a running grader: the two runtimes behind one handle.

`faust` (faust_runtime.py over app.py, the default: config.py `runtime`) and `native` (native_runtime.py,
supported and tested alike) run the same stages with the same pure core (routing, join state machine,
graders, detectors, judge groups) over the same topics; they differ in how records move and how the
exactly-once effect is reached (README.md, "Runtimes", and "Which runtime is the default, and why").
Both are a `shared.service.ServiceHandle`: `__main__` runs either with `run_service`, which owns the
signals and the metrics endpoint.
"""

from __future__ import annotations

from services.grader.config import GraderSettings
from shared.grading import GraderConfig
from shared.service import ServiceHandle

RUNTIMES = ("faust", "native")
"""The default first."""

GraderRuntime = ServiceHandle
"""A runtime is the grader's handle: start / wait / stop / exit_code (shared/service.py)."""


def make_runtime(name: str, settings: GraderSettings, config: GraderConfig) -> GraderRuntime:
    """The runtime called `name`; raises ValueError for an unknown one. Heavy imports happen here."""
    if name == "native":
        from services.grader.native_runtime import NativeRuntime

        return NativeRuntime(settings, config)
    if name == "faust":
        from services.grader.faust_runtime import FaustRuntime

        return FaustRuntime(settings, config)
    raise ValueError(f"unknown grader runtime {name!r} (known: {', '.join(RUNTIMES)})")
