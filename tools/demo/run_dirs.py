"""Old demo run folders are pruned so that repeated `apprentice demo` runs do not fill the disk.

A demo run leaves its whole stack's state behind (trainer checkpoints with optimizer state, the weight
store's blobs, the pods' version folders): several GiB for SmolLM2. Its report and plot are written
outside the run folder, so an old folder is only needed to read its logs.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path

RUN_NAME = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")
"""`YYYYmmdd-HHMMSS-xxxx`: the start time, so names sort by it, and 4 hex digits against a clash."""


def new_run_dir(root: Path) -> Path:
    """A fresh run folder's path under `root` (not created)."""
    return root / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def old_runs(root: Path, keep: int) -> list[Path]:
    """Run folders under `root` beyond the `keep` newest, oldest first.

    Run folders are named as `new_run_dir` names them (RUN_NAME), so their names sort by start time; a
    name of another shape is not a run folder and is never returned.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    if not root.is_dir():
        return []
    runs = sorted(p for p in root.iterdir() if p.is_dir() and RUN_NAME.fullmatch(p.name))
    return runs[:max(len(runs) - keep, 0)]


def prune_runs(root: Path, keep: int) -> list[Path]:
    """Delete the run folders `old_runs` names; returns them."""
    doomed = old_runs(root, keep)
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed

