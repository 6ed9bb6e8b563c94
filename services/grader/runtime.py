"""GraderSettings + GraderConfig --> a running grader: the two runtimes behind one small interface.

`faust` (app.py, the default: config.py `runtime`) and `native` (native_runtime.py, supported and tested
alike) run the same stages with the same pure core (routing, join state machine, graders, detectors,
judge groups) over the same topics; they differ in how records move and how the exactly-once effect is
reached (README.md, "Runtimes", and "Which runtime is the default, and why").
"""

from __future__ import annotations

import abc

from services.grader.config import GraderSettings
from shared.grading import GraderConfig

RUNTIMES = ("faust", "native")
"""The default first."""


class GraderRuntime(abc.ABC):
    @abc.abstractmethod
    def run(self) -> int:
        """Process until SIGTERM / SIGINT (or a fatal error); return the process exit status."""


def make_runtime(name: str, settings: GraderSettings, config: GraderConfig) -> GraderRuntime:
    """The runtime called `name`; raises ValueError for an unknown one. Heavy imports happen here."""
    if name == "native":
        from services.grader.native_runtime import NativeRuntime

        return NativeRuntime(settings, config)
    if name == "faust":
        from services.grader.app import FaustRuntime

        return FaustRuntime(settings, config)
    raise ValueError(f"unknown grader runtime {name!r} (known: {', '.join(RUNTIMES)})")
