"""Policy + trainer state --> an atomic checkpoint folder; the newest complete one is the resume point.

Layout under the state dir:
    ckpts/ckpt-000007-<id>/weights/        version files (adapter_model.safetensors or model.safetensors + configs)
    ckpts/ckpt-000007-<id>/training.pt     optimizer state, step count, RNG states
    ckpts/ckpt-000007-<id>/state.json      consumed Kafka offsets, the RL buffer (pending records, trained ids,
                                           lineage), baseline, prompt pool, consolidated knowledge versions
    LATEST                                 name of the newest complete checkpoint
    published.json                         checkpoint id -> version assigned by the Weights service

Atomicity: a checkpoint is written into a hidden temp folder, every file fsynced, the folder renamed
(atomic on POSIX), and only then LATEST is replaced (write temp + fsync + rename). A kill -9 at any
moment leaves either the old LATEST (the half-written temp folder is removed at the next start) or
the new one, never a mix: weights, optimizer and offsets always describe the same instant.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.weights.client import write_knowledge_versions, write_trained_interactions

LATEST = "LATEST"
PUBLISHED = "published.json"


@dataclass
class Checkpoint:
    path: Path
    state: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.state["id"])

    @property
    def weights_dir(self) -> Path:
        return self.path / "weights"

    @property
    def training_state(self) -> Path:
        return self.path / "training.pt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            with open(Path(dirpath) / f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointStore:
    def __init__(self, root: Path, keep: int = 2, *, cleanup: bool = True) -> None:
        """`cleanup=False` for readers (torchrun ranks > 0) that must not touch rank 0's writes."""
        self.root = Path(root)
        self.dir = self.root / "ckpts"
        self.keep = max(1, keep)
        self.dir.mkdir(parents=True, exist_ok=True)
        if cleanup:
            for tmp in self.dir.glob(".tmp-*"):      # leftovers of a write that a crash interrupted
                shutil.rmtree(tmp, ignore_errors=True)

    def latest(self) -> Checkpoint | None:
        marker = self.root / LATEST
        if not marker.exists():
            return None
        path = self.dir / marker.read_text().strip()
        return Checkpoint(path, json.loads((path / "state.json").read_text()))

    def write(self, policy: Any, state: dict[str, Any]) -> Checkpoint:
        """Write weights + optimizer + `state` as the new newest checkpoint (state gets `id`, `seq`)."""
        prev = self.latest()
        seq = (int(prev.state["seq"]) + 1) if prev else 1
        ckpt_id = f"ckpt-{seq:06d}-{uuid.uuid4().hex[:8]}"
        state = {**state, "id": ckpt_id, "seq": seq, "parent": prev.id if prev else ""}
        tmp = self.dir / f".tmp-{ckpt_id}"
        tmp.mkdir(parents=True)
        state["kind"] = policy.save_weights(tmp / "weights")
        # provenance travels with the weights: uploaded, checksummed and kept with the version
        write_trained_interactions(tmp / "weights", list(state.get("trained_ids", [])))
        write_knowledge_versions(tmp / "weights", {k: int(v) for k, v in state.get("consolidated_knowledge", {}).items()})
        policy.save_training_state(tmp / "training.pt")
        (tmp / "state.json").write_text(json.dumps(state, sort_keys=True))
        _fsync_tree(tmp)
        final = self.dir / ckpt_id
        os.rename(tmp, final)
        _fsync_dir(self.dir)
        marker_tmp = self.root / f".{LATEST}.tmp"
        marker_tmp.write_text(ckpt_id)
        with open(marker_tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(marker_tmp, self.root / LATEST)
        _fsync_dir(self.root)
        self._prune(keep_id=ckpt_id)
        return Checkpoint(final, state)

    def _prune(self, keep_id: str) -> None:
        done = self.published()
        ckpts = sorted(p for p in self.dir.iterdir() if p.is_dir() and p.name.startswith("ckpt-"))
        for p in ckpts[:-self.keep]:
            if p.name != keep_id and p.name in done:     # an unpublished checkpoint still has to be uploaded
                shutil.rmtree(p, ignore_errors=True)

    # --- publication records -------------------------------------------------------------------------
    def published(self) -> dict[str, dict[str, str]]:
        path = self.root / PUBLISHED
        return json.loads(path.read_text()) if path.exists() else {}

    def mark_published(self, ckpt_id: str, version: str, manifest_sha256: str) -> None:
        done = self.published()
        done[ckpt_id] = {"version": version, "manifest_sha256": manifest_sha256}
        write_json_atomic(self.root / PUBLISHED, done)
