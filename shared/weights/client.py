"""Checkpoint files <--> the Weights service, and model <--> checkpoint files.

Used by the trainer (save + upload), inference pods (load for hot swap; the download itself is
`shared/weights/download.py`) and the weights eval gate (load). File layout of a version:
- full: `model.safetensors` (or shards), `config.json`, `generation_config.json`
- lora: `adapter_model.safetensors`, `adapter_config.json` (peft's format); applied to the base model
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.models import LOAD_LOCK, load_model
from shared.proto.apprentice.v1 import weights_pb2
from shared.weights.formats import require_safetensors

CHUNK = 1 << 20  # 1 MiB: large enough for throughput, small enough for gRPC's default message limits
FULL, LORA = "full", "lora"
TRAINED_INTERACTIONS = "trained_interactions.json"
"""A version's provenance file: the sorted ids of the interactions it learned from (JSON list), written
by the trainer into every checkpoint, so it is uploaded, checksummed and kept with the weights."""


KNOWLEDGE_VERSIONS = "knowledge_versions.json"
"""A version's knowledge provenance: the knowledge items it consolidated, item id -> revision (JSON object),
written by the trainer beside `TRAINED_INTERACTIONS`. A file, not manifest metadata: a base of thousands of
items would pass the manifest's 64 KiB metadata bound (services/weights/metadata.py)."""


class WeightsIntegrityError(RuntimeError):
    """Downloaded bytes do not match the manifest. Not recoverable by retrying the same bytes."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def file_entries(src_dir: Path) -> list[weights_pb2.FileEntry]:
    files = sorted(p for p in Path(src_dir).rglob("*") if p.is_file())
    return [weights_pb2.FileEntry(path=str(p.relative_to(src_dir)), size=p.stat().st_size, sha256=sha256_file(p))
            for p in files]


def write_trained_interactions(weights_dir: Path, ids: list[str]) -> int:
    """Write `TRAINED_INTERACTIONS` (sorted, unique ids) into a version's folder; returns the count."""
    ordered = sorted(set(ids))
    Path(weights_dir).mkdir(parents=True, exist_ok=True)
    (Path(weights_dir) / TRAINED_INTERACTIONS).write_text(json.dumps(ordered), encoding="utf-8")
    return len(ordered)


def write_knowledge_versions(weights_dir: Path, items: dict[str, int]) -> int:
    """Write `KNOWLEDGE_VERSIONS` (item id -> revision, sorted) into a version's folder; returns the count."""
    Path(weights_dir).mkdir(parents=True, exist_ok=True)
    (Path(weights_dir) / KNOWLEDGE_VERSIONS).write_text(json.dumps(items, sort_keys=True), encoding="utf-8")
    return len(items)


def read_version_file(stub: Any, model: str, version: str, path: str, *, max_bytes: int = 64 << 20,
                      timeout: float = 60.0) -> bytes:
    """One small file of a stored version (`Weights.Download` with `path`), checked against the manifest's
    size and sha256: a provenance file is evidence, so a corrupted copy must fail, not be believed."""
    manifest = stub.Get(weights_pb2.GetVersionRequest(model=model, version=version), timeout=timeout)
    entry = next((f for f in manifest.files if f.path == path), None)
    if entry is None:
        raise FileNotFoundError(f"{model} {version} has no file {path!r}")
    if entry.size > max_bytes:
        raise ValueError(f"{model} {version} {path}: {entry.size} bytes, over the limit of {max_bytes}")
    buf = bytearray()
    for chunk in stub.Download(weights_pb2.DownloadRequest(model=model, version=version, path=path), timeout=timeout):
        buf += chunk.data
    if len(buf) != entry.size or hashlib.sha256(buf).hexdigest() != entry.sha256:
        raise WeightsIntegrityError(f"{model} {version} {path}: the bytes received do not match the manifest")
    return bytes(buf)


# --- upload / download ------------------------------------------------------------------------------
def _upload_stream(header: weights_pb2.UploadHeader, src_dir: Path) -> Iterator[weights_pb2.UploadRequest]:
    yield weights_pb2.UploadRequest(header=header)
    for entry in header.files:
        with open(Path(src_dir) / entry.path, "rb") as f:
            offset = 0
            while block := f.read(CHUNK):
                yield weights_pb2.UploadRequest(chunk=weights_pb2.FileChunk(path=entry.path, offset=offset, data=block))
                offset += len(block)


def upload_version(stub: Any, header: weights_pb2.UploadHeader, src_dir: Path | str,
                   timeout: float = 600.0) -> weights_pb2.Manifest:
    """Stream every file under `src_dir` to `Weights.Upload`; the header's file list is filled in here
    (sizes + sha256), so the server can reject any mismatch. Returns the stored manifest."""
    src = Path(src_dir)
    h = weights_pb2.UploadHeader()
    h.CopyFrom(header)
    del h.files[:]
    h.files.extend(file_entries(src))
    return stub.Upload(_upload_stream(h, src), timeout=timeout)


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def save_version_files(model: Any, dest_dir: Path | str, kind: str | None = None) -> str:
    """Write a model (or a peft adapter) in the version layout; returns the kind written."""
    kind = kind or (LORA if is_lora(model) else FULL)
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    if kind == LORA:
        if not is_lora(model):
            raise ValueError("kind='lora' needs a peft model")
        model.save_pretrained(dest, safe_serialization=True)
    elif kind == FULL:
        target = model.merge_and_unload() if is_lora(model) else model
        target.save_pretrained(dest, safe_serialization=True)
    else:
        raise ValueError(f"unknown checkpoint kind {kind!r} (use 'full' or 'lora')")
    return kind


def load_version(manifest: weights_pb2.Manifest, files_dir: Path | str, base_model_name: str,
                 base_model: Any | None = None) -> Any:
    """Files of a version --> a model in eval mode. A LoRA adapter is applied to `base_model` when given
    (inference keeps one base and swaps adapters), otherwise to a fresh load of `base_model_name`."""
    # heavy: torch, transformers and peft, only when a version is loaded as a model
    import torch
    from transformers import AutoModelForCausalLM

    files = Path(files_dir)
    model: torch.nn.Module  # a PeftModel (LoRA) or a plain causal LM (full)
    if manifest.kind == LORA:
        from peft import PeftModel  # heavy: peft (4 s to import), for a LoRA version only

        base = base_model if base_model is not None else load_model(base_model_name)[0]
        with LOAD_LOCK:
            require_safetensors(files, adapter=True)  # peft would torch.load an adapter_model.bin otherwise
            model = PeftModel.from_pretrained(base, files, is_trainable=False)
    elif manifest.kind in (FULL, ""):
        require_safetensors(files, adapter=False)
        with LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(files, dtype=torch.float32, use_safetensors=True)
    else:
        raise ValueError(f"unknown checkpoint kind {manifest.kind!r}")
    model.eval()
    return model
