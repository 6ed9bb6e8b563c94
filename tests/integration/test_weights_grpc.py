"""Weights over real gRPC on loopback: upload/download round trips with hash checks, rejected corrupted and
truncated uploads, resumable downloads, request validation. Uses the tiny model's real checkpoint files."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.weights.metrics import DOWNLOAD_BYTES
from services.weights.service import RunningServer, start
from services.weights.settings import LocalStoreSettings, WeightsSettings
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.weights import download as weights_download
from shared.weights.client import (
    WeightsIntegrityError,
    file_entries,
    save_version_files,
    sha256_file,
    upload_version,
)
from shared.weights.download import DownloadClient, download_version

pytestmark = pytest.mark.integration
MODEL = "tiny-random"


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", f"test-{uuid.uuid4().hex[:8]}.")  # no Kafka traffic here
    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"),
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
    (src / "sub" / "weights.safetensors").write_bytes(b"w" * 1000)
    (src / "empty.json").write_bytes(b"")
    m = upload_version(stub, header(), src)
    got = download_version(stub, MODEL, m.version, tmp_path / "dl")
    assert got.version == "v1" and (tmp_path / "dl" / "empty.json").read_bytes() == b""
    assert (tmp_path / "dl" / "sub" / "weights.safetensors").read_bytes() == b"w" * 1000


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


def test_download_of_a_range(stub: weights_pb2_grpc.WeightsStub, checkpoint: Path) -> None:
    """offset + length: exactly those bytes (what parallel range streams ask for), in chunk_size pieces."""
    m = upload_version(stub, header(), checkpoint)
    entry = next(f for f in m.files if f.path == "model.safetensors")
    data = (checkpoint / entry.path).read_bytes()
    chunks = list(stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1", path=entry.path,
                                                            offset=1000, length=(1 << 20) + 5, chunk_size=1 << 19)))
    assert [c.offset for c in chunks] == [1000, 1000 + (1 << 19), 1000 + (1 << 20)]
    assert b"".join(c.data for c in chunks) == data[1000:1000 + (1 << 20) + 5]
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1", length=5)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "length needs path" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Download(weights_pb2.DownloadRequest(model=MODEL, version="v1", path=entry.path,
                                                       offset=entry.size - 3, length=4)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "past the end" in e.value.details()


@pytest.fixture
def fast(server: RunningServer) -> Iterator[DownloadClient]:
    with DownloadClient(f"127.0.0.1:{server.port}", connections=3) as client:
        yield client


def test_parallel_range_streams(fast: DownloadClient, stub: weights_pb2_grpc.WeightsStub, checkpoint: Path,
                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large file as 3 range streams on 3 connections, hand-decoded chunks: same bytes, verified, in place."""
    monkeypatch.setattr(weights_download, "MIN_RANGE", 1 << 20)
    m = upload_version(stub, header(), checkpoint)
    before = DOWNLOAD_BYTES._value.get()
    got = download_version(fast, MODEL, m.version, tmp_path / "dl", streams=3, chunk_size=1 << 18)
    assert got == m and DOWNLOAD_BYTES._value.get() - before == sum(f.size for f in m.files)  # no byte twice
    for f in m.files:
        assert sha256_file(tmp_path / "dl" / f.path) == f.sha256
    assert not (tmp_path / "dl.partial").exists()
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == sorted(f.path for f in m.files)  # no markers


class Breaking:
    """A real stream of `path` that the client loses after `after` chunks (the call is cancelled) once,
    and that may drop `length` from its requests, as a server that predates the field would ignore it."""

    def __init__(self, inner: DownloadClient, *, after: int = 10**9, drop_length: bool = False,
                 path: str = "model.safetensors") -> None:
        self.inner, self.after, self.drop_length, self.path = inner, after, drop_length, path
        self.requests: list[weights_pb2.DownloadRequest] = []

    def Get(self, request: weights_pb2.GetVersionRequest, timeout: float | None = None) -> weights_pb2.Manifest:  # noqa: N802
        return self.inner.Get(request, timeout=timeout)

    def Download(self, request: weights_pb2.DownloadRequest, timeout: float | None = None) -> Any:  # noqa: N802
        self.requests.append(request)
        req = weights_pb2.DownloadRequest()
        req.CopyFrom(request)
        if self.drop_length:
            req.length = 0
        break_after = 10**9
        if request.path == self.path:
            break_after, self.after = self.after, 10**9  # break the first call for that file only
        return _BreakingCall(self.inner.Download(req, timeout=timeout), break_after)


class _BreakingCall:
    """Iterates a real call; after `after` chunks it cancels the call, so the next read raises RpcError."""

    def __init__(self, call: Any, after: int) -> None:
        self.call, self.after, self.seen = call, after, 0

    def __iter__(self) -> _BreakingCall:
        return self

    def __next__(self) -> object:
        if self.seen == self.after:
            self.call.cancel()
        self.seen += 1
        return next(self.call)

    def cancel(self) -> bool:
        return bool(self.call.cancel())


def test_broken_range_stream_resumes_where_it_stopped(fast: DownloadClient, stub: weights_pb2_grpc.WeightsStub,
                                                      checkpoint: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights_download, "MIN_RANGE", 1 << 20)
    m = upload_version(stub, header(), checkpoint)
    entry = next(f for f in m.files if f.path == "model.safetensors")
    source = Breaking(fast, after=3)
    download_version(source, MODEL, m.version, tmp_path / "dl", streams=2, chunk_size=1 << 18)
    assert sha256_file(tmp_path / "dl" / entry.path) == entry.sha256
    big = [r for r in source.requests if r.path == entry.path]
    assert len(big) == 3  # two ranges, one of them broken after 3 chunks and asked again from there
    first, retry = big[0], big[2]
    assert (retry.offset, retry.offset + retry.length) == (first.offset + 3 * (1 << 18), first.offset + first.length)


def test_server_without_length_field(fast: DownloadClient, stub: weights_pb2_grpc.WeightsStub, checkpoint: Path,
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a server that streams to the end of the file, each range keeps only its bytes and hangs up."""
    monkeypatch.setattr(weights_download, "MIN_RANGE", 1 << 20)
    m = upload_version(stub, header(), checkpoint)
    download_version(Breaking(fast, drop_length=True), MODEL, m.version, tmp_path / "dl", streams=3,
                     chunk_size=(1 << 20) + 3)
    for f in m.files:
        assert sha256_file(tmp_path / "dl" / f.path) == f.sha256


def test_failed_parallel_download_keeps_a_resumable_prefix(fast: DownloadClient, stub: weights_pb2_grpc.WeightsStub,
                                                           checkpoint: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A range that keeps failing fails the call; the partial file is cut to its complete prefix, so the
    next call resumes from there (and a crash's leftover with holes is started over, never trusted)."""
    monkeypatch.setattr(weights_download, "MIN_RANGE", 1 << 20)
    m = upload_version(stub, header(), checkpoint)
    entry = next(f for f in m.files if f.path == "model.safetensors")
    with pytest.raises(grpc.RpcError):
        download_version(Breaking(fast, after=2), MODEL, m.version, tmp_path / "dl", streams=2, attempts=1,
                         chunk_size=1 << 18)
    part = tmp_path / "dl.partial" / entry.path
    data = (checkpoint / entry.path).read_bytes()
    have = part.stat().st_size
    assert have < entry.size and part.read_bytes() == data[:have]
    assert not list(part.parent.glob(".*.inflight"))
    before = DOWNLOAD_BYTES._value.get()
    done_before = sum(f.size for f in m.files if (tmp_path / "dl.partial" / f.path).exists() and f != entry)
    download_version(fast, MODEL, m.version, tmp_path / "dl", streams=2)
    assert DOWNLOAD_BYTES._value.get() - before == sum(f.size for f in m.files) - have - done_before
    assert sha256_file(tmp_path / "dl" / entry.path) == entry.sha256
    # a crash mid-way leaves holes and the in-flight marker: that file is fetched again from byte 0
    crashed = tmp_path / "dl2.partial"
    crashed.mkdir()
    (crashed / entry.path).write_bytes(b"\0" * entry.size)
    (crashed / f".{entry.path}.{entry.sha256[:16]}.inflight").touch()
    download_version(fast, MODEL, m.version, tmp_path / "dl2", streams=2)
    assert sha256_file(tmp_path / "dl2" / entry.path) == entry.sha256
