"""Progress of a long step (rate and ETA) for a person watching a terminal, and for nobody else.

A bar is drawn on stderr only when stderr is a terminal and this process does not log JSON (shared/logs.py):
a log file, a pipe or a collector never receives carriage returns or ANSI escapes. `APPRENTICE_PROGRESS=0`
turns bars off everywhere; `=1` forces them on a stream that is not a terminal (still never with JSON logs).
Everywhere else the returned object is a disabled bar: callers update it the same way at no cost.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import tqdm

from shared.logs import json_logs_active

T = TypeVar("T")


def progress_enabled(stream: Any = None) -> bool:
    stream = sys.stderr if stream is None else stream
    forced = os.environ.get("APPRENTICE_PROGRESS", "").strip().lower()
    if forced in ("0", "false", "no", "off") or json_logs_active():
        return False
    if forced in ("1", "true", "yes", "on"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def progress(iterable: Iterable[T] | None = None, *, total: float | None = None, desc: str = "",
             unit: str = "it", stream: Any = None, **kwargs: Any) -> tqdm[T]:
    """A tqdm bar on `stream` (stderr), disabled unless `progress_enabled`. Use as tqdm: iterate it, or
    `update(n)` / `set_postfix_str(...)`, and close it (or use it as a context manager)."""
    stream = sys.stderr if stream is None else stream
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, disable=not progress_enabled(stream),
                dynamic_ncols=True, leave=kwargs.pop("leave", True), **kwargs)
