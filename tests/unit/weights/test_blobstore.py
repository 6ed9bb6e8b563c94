"""LocalBlobStore: blobs appear only when committed with the declared size and hash."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from services.weights.blob_backends import make_blob_store
from services.weights.blobstore import BlobMismatch


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_commit_makes_blob_visible_under_its_hash(tmp_path: Path) -> None:
    bs = make_blob_store("local", tmp_path)
    w = bs.writer()
    w.write(b"hello ")
    w.write(b"world")
    assert not bs.exists(sha(b"hello world"))  # not visible before commit
    assert w.commit(sha(b"hello world"), 11) == sha(b"hello world")
    assert bs.exists(sha(b"hello world")) and bs.size(sha(b"hello world")) == 11
    with bs.open(sha(b"hello world")) as f:
        assert f.read() == b"hello world"
    assert list(bs.list()) == [sha(b"hello world")]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_mismatch_discards_bytes(tmp_path: Path) -> None:
    bs = make_blob_store("local", tmp_path)
    w = bs.writer()
    w.write(b"abc")
    with pytest.raises(BlobMismatch):
        w.commit(sha(b"abd"), 3)
    w2 = bs.writer()
    w2.write(b"abc")
    with pytest.raises(BlobMismatch):
        w2.commit(sha(b"abc"), 4)
    assert list(bs.list()) == [] and list((tmp_path / "tmp").iterdir()) == []


def test_same_content_is_stored_once(tmp_path: Path) -> None:
    bs = make_blob_store("local", tmp_path)
    for _ in range(2):
        w = bs.writer()
        w.write(b"same")
        w.commit(sha(b"same"), 4)
    assert list(bs.list()) == [sha(b"same")]
    assert bs.delete(sha(b"same")) and not bs.delete(sha(b"same"))


def test_abandoned_partial_writes_are_cleaned(tmp_path: Path) -> None:
    bs = make_blob_store("local", tmp_path)
    w = bs.writer()
    w.write(b"partial")
    old = time.time() - 7200
    for f in (tmp_path / "tmp").iterdir():
        os.utime(f, (old, old))
    assert bs.clean_temporary(3600) == 1


def test_unknown_backend_raises() -> None:
    with pytest.raises(ValueError, match="unknown blob store 's3'.*local"):
        make_blob_store("s3", Path("/nonexistent"))
