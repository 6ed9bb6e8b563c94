"""Weights over real gRPC on loopback: upload/download round trips with hash checks, rejected corrupted and
truncated uploads, resumable downloads, request validation. Uses the tiny model's real checkpoint files."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.weights.config import WeightsSettings
from services.weights.server import DOWNLOAD_BYTES, RunningServer, start
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.weights_client import (
    WeightsIntegrityError,
    download_version,
    file_entries,
    save_version_files,
    sha256_file,
    upload_version,
)

pytestmark = pytest.mark.integration
MODEL = "tiny-random"


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", f"test-{uuid.uuid4().hex[:8]}.")  # no Kafka traffic here
    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store_dir=tmp_path / "store",
                               policy="manual")
    running = start(settings, consume=False)
    yield running
    running.stop(grace=1.0)


@pytest.fixture
def stub(server: RunningServer) -> Iterator[weights_pb2_grpc.WeightsStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}",
                                    options=[("grpc.max_receive_message_length", 64 << 20)])
    yield weights_pb2_grpc.WeightsStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> Path:
    from shared.models import load_model

    model, _ = load_model(tiny_model_name)
    out = tmp_path_factory.mktemp("ckpt") / "full"
    save_version_files(model, out, "full")
    return out


def header(**kw: object) -> weights_pb2.UploadHeader:
    kw.setdefault("model", MODEL)
    kw.setdefault("kind", "full")
    return weights_pb2.UploadHeader(**kw)  # type: ignore[arg-type]


def test_upload_download_round_trip(stub: weights_pb2_grpc.WeightsStub, checkpoint: Path, tmp_path: Path) -> None:
    m = upload_version(stub, header(parent_version="base", algorithm="grpo", tenant="acme",
                                    train_metrics={"loss": 0.5}), checkpoint)
    assert m.version == "v1" and m.status == weights_pb2.VERSION_STATUS_CANDIDATE and m.tenant == "acme"
    assert {f.path for f in m.files} == {"model.safetensors", "config.json", "generation_config.json"}
    assert [(f.path, f.sha256) for f in m.files] == [(f.path, f.sha256) for f in file_entries(checkpoint)]
    got = download_version(stub, MODEL, "v1", tmp_path / "dl")
    assert got == m
    for f in m.files:
        assert sha256_file(tmp_path / "dl" / f.path) == f.sha256 == sha256_file(checkpoint / f.path)
    assert upload_version(stub, header(), checkpoint).version == "v2"  # numbering per model
    listed = stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions
    assert [v.version for v in listed] == ["v1", "v2"]
    assert stub.Get(weights_pb2.GetVersionRequest(model=MODEL, version="v2")).files == m.files
    # the whole-version stream: the manifest rides on the first chunk, files follow in manifest order
    chunks = list(stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1")))
    assert chunks[0].manifest == m and not chunks[1].HasField("manifest")
    for f in m.files:
        data = b"".join(c.data for c in chunks if c.path == f.path)
        assert hashlib.sha256(data).hexdigest() == f.sha256 and len(data) == f.size


def test_empty_and_nested_files(stub: weights_pb2_grpc.WeightsStub, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "weights.bin").write_bytes(b"w" * 1000)
    (src / "empty.json").write_bytes(b"")
    m = upload_version(stub, header(), src)
    got = download_version(stub, MODEL, m.version, tmp_path / "dl")
    assert got.version == "v1" and (tmp_path / "dl" / "empty.json").read_bytes() == b""
    assert (tmp_path / "dl" / "sub" / "weights.bin").read_bytes() == b"w" * 1000


def _stream(h: weights_pb2.UploadHeader, parts: list[tuple[str, int, bytes]]) -> Iterator[weights_pb2.UploadRequest]:
    yield weights_pb2.UploadRequest(header=h)
    for path, off, data in parts:
        yield weights_pb2.UploadRequest(chunk=weights_pb2.FileChunk(path=path, offset=off, data=data))


def test_corrupted_and_truncated_uploads_are_rejected(stub: weights_pb2_grpc.WeightsStub, server: RunningServer,
                                                      checkpoint: Path) -> None:
    data = (checkpoint / "model.safetensors").read_bytes()
    entry = weights_pb2.FileEntry(path="model.safetensors", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    corrupted = bytearray(data)
    corrupted[len(data) // 2] ^= 0xFF  # one flipped byte
    with pytest.raises(grpc.RpcError) as e:
        stub.Upload(_stream(header(files=[entry]), [("model.safetensors", 0, bytes(corrupted))]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sha256 mismatch" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Upload(_stream(header(files=[entry]), [("model.safetensors", 0, data[: len(data) - 1000])]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "truncated" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Upload(_stream(header(files=[entry]), [("model.safetensors", 0, data + b"x")]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "more bytes than the declared" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Upload(iter([weights_pb2.UploadRequest(chunk=weights_pb2.FileChunk(path="x"))]))
    assert "first message of an Upload must be the header" in e.value.details()
    assert list(stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions) == []
    assert list(server.service.store.blobs.list()) == []  # nothing of the rejected bytes was kept


def test_cancelled_upload_is_never_visible(stub: weights_pb2_grpc.WeightsStub, server: RunningServer,
                                           checkpoint: Path) -> None:
    data = (checkpoint / "model.safetensors").read_bytes()
    entry = weights_pb2.FileEntry(path="model.safetensors", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    half_sent = threading.Event()
    never = threading.Event()

    def requests() -> Iterator[weights_pb2.UploadRequest]:
        yield weights_pb2.UploadRequest(header=header(files=[entry]))
        yield weights_pb2.UploadRequest(chunk=weights_pb2.FileChunk(path=entry.path, offset=0, data=data[:1 << 20]))
        half_sent.set()
        never.wait(10)  # the client "dies" mid-upload

    fut = stub.Upload.future(requests())
    assert half_sent.wait(5)
    assert list(stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions) == []
    fut.cancel()
    never.set()
    tmp = server.service.store.root / "tmp"
    for _ in range(50):
        if not list(tmp.glob("*.part")):
            break
        threading.Event().wait(0.1)
    assert list(tmp.glob("*.part")) == [] and list(server.service.store.blobs.list()) == []
    assert list(stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions) == []


def test_resumable_download(stub: weights_pb2_grpc.WeightsStub, checkpoint: Path, tmp_path: Path) -> None:
    m = upload_version(stub, header(), checkpoint)
    entry = next(f for f in m.files if f.path == "model.safetensors")
    # 1) a stream broken after two 1 MiB chunks...
    got = bytearray()
    stream = stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1", path=entry.path,
                                                       chunk_size=1 << 20))
    for chunk in stream:
        assert chunk.offset == len(got) and chunk.file_size == entry.size and chunk.file_sha256 == entry.sha256
        got += chunk.data
        if len(got) >= 2 << 20:
            stream.cancel()
            break
    # 2) ...resumes from the offset it reached
    for chunk in stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1", path=entry.path,
                                                           offset=len(got))):
        assert chunk.offset == len(got)
        got += chunk.data
    assert hashlib.sha256(got).hexdigest() == entry.sha256
    # 3) the client helper resumes a partial file left by an interrupted download and sends only the rest
    dest = tmp_path / "v1"
    partial = dest.with_name("v1.partial")
    partial.mkdir()
    have = 3 * (1 << 20) + 17
    (partial / entry.path).write_bytes((checkpoint / entry.path).read_bytes()[:have])
    before = DOWNLOAD_BYTES._value.get()
    download_version(stub, MODEL, "v1", dest)
    sent = DOWNLOAD_BYTES._value.get() - before
    assert sent == sum(f.size for f in m.files) - have
    assert sha256_file(dest / entry.path) == entry.sha256 and not partial.exists()
    # 4) resuming at the very end yields one empty chunk (the client learns the file is complete)
    tail = list(stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1", path=entry.path,
                                                          offset=entry.size)))
    assert [(c.offset, c.data) for c in tail] == [(entry.size, b"")]


def test_download_detects_corrupted_store(stub: weights_pb2_grpc.WeightsStub, server: RunningServer,
                                          checkpoint: Path, tmp_path: Path) -> None:
    m = upload_version(stub, header(), checkpoint)
    entry = next(f for f in m.files if f.path == "model.safetensors")
    blob = server.service.store.blobs.local_path(entry.sha256)
    assert blob is not None
    raw = bytearray(blob.read_bytes())
    raw[100] ^= 0x01  # bit rot on disk, same size
    blob.write_bytes(bytes(raw))
    with pytest.raises(WeightsIntegrityError, match="sha256"):
        download_version(stub, MODEL, "v1", tmp_path / "dl")
    assert not (tmp_path / "dl").exists()  # a pod never sees the corrupted files in place


@pytest.mark.parametrize(("req", "code", "text"), [
    (weights_pb2.DownloadRequest(model=MODEL, version="v1", offset=5), grpc.StatusCode.INVALID_ARGUMENT,
     "offset needs path"),
    (weights_pb2.DownloadRequest(model=MODEL, version="v1", chunk_size=1 << 30), grpc.StatusCode.INVALID_ARGUMENT,
     "chunk_size must be in"),
    (weights_pb2.DownloadRequest(model=MODEL, version="v7"), grpc.StatusCode.NOT_FOUND, "no version 'v7'"),
    (weights_pb2.DownloadRequest(model=MODEL, version="v1", path="nope"), grpc.StatusCode.NOT_FOUND, "no file"),
    (weights_pb2.DownloadRequest(model=MODEL, version="v1", path="config.json", offset=10 ** 9),
     grpc.StatusCode.INVALID_ARGUMENT, "past the end"),
    (weights_pb2.DownloadRequest(model=MODEL), grpc.StatusCode.FAILED_PRECONDITION, "base model is not stored"),
    (weights_pb2.DownloadRequest(model=""), grpc.StatusCode.INVALID_ARGUMENT, "model must not be empty"),
])
def test_download_validation(stub: weights_pb2_grpc.WeightsStub, checkpoint: Path,
                             req: weights_pb2.DownloadRequest, code: grpc.StatusCode, text: str) -> None:
    upload_version(stub, header(), checkpoint)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Download(req))
    assert e.value.code() == code and text in e.value.details()
