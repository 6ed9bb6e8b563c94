"""Checkpoint files <--> the Weights service, and model <--> checkpoint files.

Used by the trainer (save + upload), inference pods (download + load for hot swap) and the weights
eval gate (load). File layout of a version:
- full: `model.safetensors` (or shards), `config.json`, `generation_config.json`
- lora: `adapter_model.safetensors`, `adapter_config.json` (peft's format); applied to the base model
"""

from __future__ import annotations

import hashlib
import os
import queue
import shutil
import threading
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

    dest = Path(dest_dir)
    manifest = stub.Get(weights_pb2.GetVersionRequest(model=model, version=version), timeout=timeout)
    tmp = dest.with_name(dest.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    for entry in manifest.files:
        target = tmp / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()  # an empty file has no bytes to stream but must still exist
        got = _fetch_file(stub, model, manifest.version, entry, target, timeout=timeout, attempts=attempts)
        if got != entry.sha256:
            target.unlink(missing_ok=True)
            raise WeightsIntegrityError(f"{model}@{manifest.version}/{entry.path}: sha256 {got} != manifest {entry.sha256}")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return manifest


def _fetch_file(stub: Any, model: str, version: str, entry: weights_pb2.FileEntry, target: Path, *,
                timeout: float, attempts: int) -> str:
    """Stream one file to `target` (resuming from its current size) and return its sha256.

    The receiving thread only queues chunks; a writer thread writes and hashes them (file writes and
    hashlib release the GIL), so the network, the disk and the hash overlap and the file is never read
    back for verification.
    """
    import grpc

    if target.stat().st_size > entry.size:
        target.write_bytes(b"")
    h = hashlib.sha256()
    with open(target, "rb") as f:  # bytes from an interrupted earlier attempt
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    for attempt in range(attempts):
        have = target.stat().st_size
        if have == entry.size:
            break
        q: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        failed: list[BaseException] = []

        def write(f: Any, q: queue.Queue[bytes | None] = q, failed: list[BaseException] = failed) -> None:
            try:
                while (data := q.get()) is not None:
                    f.write(data)
                    h.update(data)
            except BaseException as e:  # noqa: BLE001 - re-raised by the receiver
                failed.append(e)
                while q.get() is not None:  # drain so the receiver never blocks
                    pass

        with open(target, "ab") as f:
            writer = threading.Thread(target=write, args=(f,), name="download-writer")
            writer.start()
            expected_offset = have
            try:
                req = weights_pb2.DownloadRequest(model=model, version=version, path=entry.path, offset=have)
                for chunk in stub.Download(req, timeout=timeout):
                    if chunk.offset != expected_offset:
                        raise WeightsIntegrityError(f"{entry.path}: chunk at {chunk.offset}, expected {expected_offset}")
                    q.put(chunk.data)
                    expected_offset += len(chunk.data)
            except grpc.RpcError:
                if attempt == attempts - 1:
                    raise
            finally:
                q.put(None)
                writer.join()
        if failed:
            raise failed[0]
    return h.hexdigest()


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

    from shared.models import LOAD_LOCK, load_model

    files = Path(files_dir)
    if manifest.kind == LORA:
        from peft import PeftModel

        base = base_model if base_model is not None else load_model(base_model_name)[0]
        with LOAD_LOCK:
            model = PeftModel.from_pretrained(base, files, is_trainable=False)
    elif manifest.kind in (FULL, ""):
        with LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(files, dtype=torch.float32)
    else:
        raise ValueError(f"unknown checkpoint kind {manifest.kind!r}")
    model.eval()
    return model
