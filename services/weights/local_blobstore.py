"""Bytes --> files `blobs/<aa>/<sha256>` under a local directory, written via `tmp/` + fsync + rename."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from services.weights.blobstore import SHA256_RE, BlobMismatch, BlobStore, BlobWriter


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBlobWriter(BlobWriter):
    def __init__(self, store: LocalBlobStore) -> None:
        self._store = store
        self._tmp = store.tmp_dir / f"{uuid.uuid4().hex}.part"
        self._file: BinaryIO | None = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self._hash = hashlib.sha256()
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def write(self, data: bytes) -> None:
        if self._file is None:
            raise RuntimeError("blob writer already closed")
        self._file.write(data)
        self._hash.update(data)
        self._size += len(data)

    def commit(self, expected_sha256: str, expected_size: int) -> str:
        if self._file is None:
            raise RuntimeError("blob writer already closed")
        digest = self.sha256
        if self._size != expected_size or digest != expected_sha256:
            self.abort()
            raise BlobMismatch(f"got {self._size} bytes with sha256 {digest}, "
                               f"declared {expected_size} bytes with sha256 {expected_sha256}")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        final = self._store.path_of(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            self._tmp.unlink(missing_ok=True)  # same content already stored: deduplicated
        else:
            os.replace(self._tmp, final)
            _fsync_dir(final.parent)
        return digest

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._tmp.unlink(missing_ok=True)


class LocalBlobStore(BlobStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blob_dir = self.root / "blobs"
        self.tmp_dir = self.root / "tmp"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def path_of(self, sha256: str) -> Path:
        if not SHA256_RE.match(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.blob_dir / sha256[:2] / sha256

    def writer(self) -> BlobWriter:
        return LocalBlobWriter(self)

    def exists(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def size(self, sha256: str) -> int:
        return self.path_of(sha256).stat().st_size

    def open(self, sha256: str) -> BinaryIO:
        return open(self.path_of(sha256), "rb")  # noqa: SIM115 - the caller closes it

    def delete(self, sha256: str) -> bool:
        try:
            self.path_of(sha256).unlink()
            return True
        except FileNotFoundError:
            return False

    def list(self) -> Iterator[str]:
        for sub in sorted(self.blob_dir.iterdir()):
            if sub.is_dir():
                for f in sorted(sub.iterdir()):
                    if SHA256_RE.match(f.name):
                        yield f.name

    def local_path(self, sha256: str) -> Path | None:
        return self.path_of(sha256)

    def clean_temporary(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        removed = 0
        for f in self.tmp_dir.glob("*.part"):
            try:
                if f.stat().st_mtime < cutoff:
                    f.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
