"""Old demo run folders are pruned so that repeated `apprentice demo` runs do not fill the disk.

A demo run leaves its whole stack's state behind (trainer checkpoints with optimizer state, the weight
store's blobs, the pods' version folders): several GiB for SmolLM2. Its report and plot are written
outside the run folder, so an old folder is only needed to read its logs.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def old_runs(root: Path, keep: int) -> list[Path]:
    """Run folders under `root` beyond the `keep` newest, oldest first.

    Folders are named `YYYYmmdd-HHMMSS-xxxx`, so their names sort by start time; a name of another shape
    is not a run folder and is never returned.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    if not root.is_dir():
        return []
    runs = sorted(p for p in root.iterdir() if p.is_dir() and _is_run_name(p.name))
    return runs[:max(len(runs) - keep, 0)]


def prune_runs(root: Path, keep: int) -> list[Path]:
    """Delete the run folders `old_runs` names; returns them."""
    doomed = old_runs(root, keep)
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _is_run_name(name: str) -> bool:
    parts = name.split("-")
    return (len(parts) == 3 and len(parts[0]) == 8 and parts[0].isdigit() and len(parts[1]) == 6
            and parts[1].isdigit() and len(parts[2]) == 4 and all(c in "0123456789abcdef" for c in parts[2]))
