"""WeightStore uploads: verified, numbered, never partially visible; validation errors are precise."""

from __future__ import annotations

from typing import Any

import pytest

from services.weights.store import AlreadyExists, WeightStore
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import InvalidRequest, NotFound

from .conftest import UploadFn, entry


def test_versions_are_numbered_per_model(store: WeightStore, upload: UploadFn) -> None:
    a = upload({"w.safetensors": b"one"})
    b = upload({"w.safetensors": b"two"}, parent_version="v1", tenant="acme")
    c = upload({"w.safetensors": b"x"}, model="other")
    assert (a.version, b.version, c.version) == ("v1", "v2", "v1")
    assert b.status == weights_pb2.VERSION_STATUS_CANDIDATE and b.tenant == "acme" and b.created_at.seconds > 0
    assert [m.version for m in store.list("m")] == ["v1", "v2"]
    assert store.get("m", "v2").files[0].sha256 == entry("w.safetensors", b"two").sha256
    assert store.get("m", "base").kind == "full"  # the implicit base version
    with pytest.raises(NotFound):
        store.get("m", "v9")


def test_named_version_and_idempotent_retry(store: WeightStore, upload: UploadFn) -> None:
    m = upload({"a": b"data"}, version="exp-1")
    assert upload({"a": b"data"}, version="exp-1") == m  # the same upload again: the same manifest
    with pytest.raises(AlreadyExists):
        upload({"a": b"different"}, version="exp-1")
    assert upload({"a": b"z"}).version == "v1"


def test_lora_defaults_to_the_base_version(upload: UploadFn) -> None:
    assert upload({"adapter_model.safetensors": b"x"}, kind="lora").base_version == "base"


def test_corrupted_upload_is_rejected_and_invisible(store: WeightStore) -> None:
    header = weights_pb2.UploadHeader(model="m", kind="full", files=[entry("w", b"good bytes")])
    s = store.begin_upload(header)
    s.add(weights_pb2.FileChunk(path="w", offset=0, data=b"evil bytes"))
    with pytest.raises(InvalidRequest, match="sha256 mismatch"):
        s.finish()
    assert store.list("m") == [] and list(store.blobs.list()) == []


def test_truncated_upload_is_rejected(store: WeightStore) -> None:
    header = weights_pb2.UploadHeader(model="m", kind="full", files=[entry("w", b"0123456789"), entry("c", b"cfg")])
    s = store.begin_upload(header)
    s.add(weights_pb2.FileChunk(path="w", offset=0, data=b"01234"))
    s.add(weights_pb2.FileChunk(path="c", offset=0, data=b"cfg"))
    assert store.list("m") == []  # nothing visible while the upload is open
    with pytest.raises(InvalidRequest, match="truncated: received 5 of 10"):
        s.finish()
    s2 = store.begin_upload(header)
    s2.add(weights_pb2.FileChunk(path="w", offset=0, data=b"0123456789"))
    with pytest.raises(InvalidRequest, match="'c': no bytes received"):
        s2.finish()
    assert store.list("m") == [] and list(store.blobs.list()) == []


def test_chunks_must_be_in_order_and_within_the_declared_size(store: WeightStore) -> None:
    header = weights_pb2.UploadHeader(model="m", kind="full", files=[entry("w", b"abcdef")])
    s = store.begin_upload(header)
    with pytest.raises(InvalidRequest, match="offset 3, expected 0"):
        s.add(weights_pb2.FileChunk(path="w", offset=3, data=b"def"))
    with pytest.raises(InvalidRequest, match="more bytes than the declared 6"):
        s.add(weights_pb2.FileChunk(path="w", offset=0, data=b"abcdefg"))
    with pytest.raises(InvalidRequest, match="undeclared file 'x'"):
        s.add(weights_pb2.FileChunk(path="x", offset=0, data=b"a"))
    s.abort()


def test_files_already_stored_may_be_skipped(store: WeightStore, upload: UploadFn) -> None:
    upload({"config.json": b"{}", "w": b"weights-1"})
    header = weights_pb2.UploadHeader(model="m", kind="full", files=[entry("config.json", b"{}"), entry("w", b"w2")])
    s = store.begin_upload(header)
    s.add(weights_pb2.FileChunk(path="w", offset=0, data=b"w2"))  # config.json's bytes are already stored
    assert s.finish().version == "v2"


@pytest.mark.parametrize(("fields", "message"), [
    ({"model": ""}, "model must not be empty"),
    ({"kind": "delta"}, "kind must be one of full, lora"),
    ({"version": "base"}, "'base' is the implicit base model"),
    ({"version": "../x"}, "version '../x' must match"),
    ({"files": []}, "at least one file"),
    ({"files": [weights_pb2.FileEntry(path="../etc/passwd", size=1, sha256="0" * 64)]}, "must be relative"),
    ({"files": [weights_pb2.FileEntry(path="/abs", size=1, sha256="0" * 64)]}, "must be relative"),
    ({"files": [weights_pb2.FileEntry(path="a", size=1, sha256="XYZ")]}, "64 lowercase hex"),
    ({"files": [weights_pb2.FileEntry(path="a", size=-1, sha256="0" * 64)]}, "size must be >= 0"),
    ({"files": [entry("a", b"1"), entry("a", b"1")]}, "declared twice"),
])
def test_invalid_headers_are_refused(store: WeightStore, fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"model": "m", "kind": "full", "files": [entry("a", b"1")]}
    base.update(fields)
    with pytest.raises(InvalidRequest, match=message):
        store.begin_upload(weights_pb2.UploadHeader(**base))


def test_upload_size_limit(store: WeightStore) -> None:
    header = weights_pb2.UploadHeader(model="m", kind="full", files=[entry("a", b"12345")])
    with pytest.raises(InvalidRequest, match="more than the limit of 4"):
        store.begin_upload(header, max_bytes=4)


def test_materialise_links_files(store: WeightStore, upload: UploadFn, tmp_path) -> None:  # noqa: ANN001
    m = upload({"sub/a.txt": b"alpha", "b": b""})
    out = store.materialise(m, tmp_path / "files")
    assert (out / "sub" / "a.txt").read_bytes() == b"alpha" and (out / "b").read_bytes() == b""
