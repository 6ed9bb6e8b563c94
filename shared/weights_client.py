"""Checkpoint files <--> the Weights service, and model <--> checkpoint files.

Used by the trainer (save + upload), inference pods (download + load for hot swap) and the weights
eval gate (load). File layout of a version:
- full: `model.safetensors` (or shards), `config.json`, `generation_config.json`
- lora: `adapter_model.safetensors`, `adapter_config.json` (peft's format); applied to the base model
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.proto.apprentice.v1 import weights_pb2

CHUNK = 1 << 20  # 1 MiB: large enough for throughput, small enough for gRPC's default message limits
FULL, LORA = "full", "lora"


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


def download_version(stub: Any, model: str, version: str, dest_dir: Path | str, *,
                     timeout: float = 600.0, attempts: int = 3) -> weights_pb2.Manifest:
    """Fetch a version into `dest_dir` atomically: files land in a temp folder, each is verified against
    the manifest's sha256, and only then renamed into place. An interrupted stream resumes from the
    bytes already received (DownloadRequest.path + offset). Returns the manifest."""
    import grpc

    dest = Path(dest_dir)
    manifest = stub.Get(weights_pb2.GetVersionRequest(model=model, version=version), timeout=timeout)
    tmp = dest.with_name(dest.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    for entry in manifest.files:
        target = tmp / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()  # an empty file has no bytes to stream but must still exist
        for attempt in range(attempts):
            have = target.stat().st_size if target.exists() else 0
            if have == entry.size:
                break
            if have > entry.size:
                target.unlink()
                have = 0
            try:
                with open(target, "ab") as f:
                    req = weights_pb2.DownloadRequest(model=model, version=manifest.version, path=entry.path,
                                                      offset=have)
                    for chunk in stub.Download(req, timeout=timeout):
                        if chunk.offset != f.tell():
                            raise WeightsIntegrityError(f"{entry.path}: chunk at {chunk.offset}, expected {f.tell()}")
                        f.write(chunk.data)
            except grpc.RpcError:
                if attempt == attempts - 1:
                    raise
        got = sha256_file(target)
        if got != entry.sha256:
            target.unlink(missing_ok=True)
            raise WeightsIntegrityError(f"{model}@{manifest.version}/{entry.path}: sha256 {got} != manifest {entry.sha256}")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return manifest


# --- model <--> files -------------------------------------------------------------------------------
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
    import torch
    from transformers import AutoModelForCausalLM

    files = Path(files_dir)
    if manifest.kind == LORA:
        from peft import PeftModel

        from shared.models import load_model

        base = base_model if base_model is not None else load_model(base_model_name)[0]
        model = PeftModel.from_pretrained(base, files, is_trainable=False)
    elif manifest.kind in (FULL, ""):
        model = AutoModelForCausalLM.from_pretrained(files, dtype=torch.float32)
    else:
        raise ValueError(f"unknown checkpoint kind {manifest.kind!r}")
    model.eval()
    return model
