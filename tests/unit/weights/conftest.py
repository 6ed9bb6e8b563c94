"""Helpers for the weights unit tests: a store in a temp dir and uploads built from bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from services.weights.blob_backends import make_blob_store
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import weights_pb2


@pytest.fixture
def store(tmp_path: Path) -> WeightStore:
    root = tmp_path / "weights"
    return WeightStore(make_blob_store("local", root), root)


def entry(path: str, data: bytes) -> weights_pb2.FileEntry:
    return weights_pb2.FileEntry(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


UploadFn = Callable[..., weights_pb2.Manifest]


@pytest.fixture
def upload(store: WeightStore) -> UploadFn:
    """upload({"path": bytes}, **header fields) -> Manifest, streaming 7-byte chunks through a session."""

    def run(files: dict[str, bytes], chunk: int = 7, **fields: object) -> weights_pb2.Manifest:
        fields.setdefault("model", "m")
        fields.setdefault("kind", "full")
        header = weights_pb2.UploadHeader(files=[entry(p, d) for p, d in files.items()], **fields)  # type: ignore[arg-type]
        session = store.begin_upload(header)
        for path, data in files.items():
            for off in range(0, len(data), chunk):
                session.add(weights_pb2.FileChunk(path=path, offset=off, data=data[off:off + chunk]))
        return session.finish()

    return run


def upload_dir(store: WeightStore, src: Path, **fields: object) -> weights_pb2.Manifest:
    """Store every file under `src` as one version (the same path as an Upload call, minus gRPC)."""
    from shared.weights.client import file_entries

    fields.setdefault("model", "tiny-random")
    fields.setdefault("kind", "full")
    header = weights_pb2.UploadHeader(files=file_entries(src), **fields)  # type: ignore[arg-type]
    session = store.begin_upload(header)
    for e in header.files:
        data = (src / e.path).read_bytes()
        for off in range(0, len(data), 1 << 20):
            session.add(weights_pb2.FileChunk(path=e.path, offset=off, data=data[off:off + (1 << 20)]))
    return session.finish()
