"""Helpers for the inference tests and benchmarks: real servers on loopback, real topics, no mocks.

- `start_inference(...)`: the real service on port 0 with the tiny model and an isolated spool.
- `FileWeightsServer`: a minimal, real `apprentice.v1.Weights` gRPC server (Get, Download, Heartbeat)
  serving version files written by `shared.weights_client.save_version_files`; it stands in for the
  weights service (built separately) where a test needs one.
- `collect(...)`: read a topic from the beginning until given ids (or a count) arrived.
- `private_broker(tmp)`: a second local broker on free ports, for tests and benchmarks that stop and
  start a broker (the shared one at 9092 is never touched).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from confluent_kafka import Consumer
from google.protobuf.message import Message

from shared.kafka.security import librdkafka_config
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc


def start_inference(tmp: Path, *, model: str = "tiny-random", bootstrap: str = "127.0.0.1:9092",
                    topic_prefix: str = "", weights_endpoint: str = "127.0.0.1:1", **overrides: Any) -> Any:
    """A started InferenceApp (tiny model, port 0, metrics and HTTP API off unless `http_port` is given,
    spool/versions under `tmp`)."""
    from services.inference.config import InferenceSettings
    from services.inference.server import serve

    s: dict[str, Any] = dict(port=0, metrics_port=0, http_port=0, host="127.0.0.1",
             pod_id=f"test-{uuid.uuid4().hex[:6]}", spool_dir=tmp / "spool", download_dir=tmp / "versions",
             weights_endpoint=weights_endpoint, heartbeat_interval_s=0.5, startup_catchup_s=5.0, grace_s=5.0,
             common={"model": model, "kafka_bootstrap": bootstrap, "topic_prefix": topic_prefix,
                     "home": tmp})
    s.update(overrides)
    return serve(InferenceSettings(**s))


def _free_port_pair(start: int = 19092) -> int:
    for port in range(start, start + 2000, 10):
        free = True
        for p in (port, port + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    free = False
        if free:
            return port
    raise RuntimeError("no free port pair for a private broker")


def private_broker(tmp: Path) -> Any:
    """A LocalBroker under `tmp` (not started), reusing the shared broker's jars when they are there."""
    from shared.kafka.local_broker import REPO_ROOT, LocalBroker

    libs = REPO_ROOT / ".apprentice" / "kafka" / "libs"
    (tmp / "kafka").mkdir(parents=True, exist_ok=True)
    if (libs / ".complete").exists() and not (tmp / "kafka" / "libs").exists():
        (tmp / "kafka" / "libs").symlink_to(libs.resolve())
    port = _free_port_pair()
    return LocalBroker(tmp, port=port, controller_port=port + 1)


def collect(bootstrap: str, topic: str, msg_type: type[Message], *, want: Iterable[str] = (),
            key: Callable[[Any], str] = lambda m: m.interaction_id, count: int | None = None,
            timeout: float = 30.0) -> list[Any]:
    """Decoded records of `topic` from the beginning, until every id in `want` (by `key`) or `count`
    records arrived, or `timeout`. Returns every record read."""
    wanted = set(want)
    c = Consumer({**librdkafka_config(), "bootstrap.servers": bootstrap, "group.id": f"collect-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            ev = msg_type()
            ev.ParseFromString(m.value())
            out.append(ev)
            wanted.discard(key(ev))
            if (count is not None and len(out) >= count) or (count is None and not wanted and want):
                break
    finally:
        c.close()
    return out


class _WeightsServicer(weights_pb2_grpc.WeightsServicer):
    def __init__(self, owner: FileWeightsServer) -> None:
        self.owner = owner

    def Get(self, request: weights_pb2.GetVersionRequest, context: Any) -> weights_pb2.Manifest:
        m = self.owner.manifests.get((request.model, request.version))
        if m is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{request.model}@{request.version} not in this store")
            raise AssertionError("abort raises")
        return m

    def Download(self, request: weights_pb2.DownloadRequest, context: Any) -> Any:
        m = self.owner.manifests.get((request.model, request.version))
        if m is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{request.model}@{request.version} not in this store")
            raise AssertionError("abort raises")
        root = self.owner.dirs[(request.model, request.version)]
        entries = [e for e in m.files if not request.path or e.path == request.path]
        first = True
        for e in entries:
            offset = request.offset if request.path else 0
            with open(root / e.path, "rb") as f:
                f.seek(offset)
                while block := f.read(request.chunk_size or (256 << 10)):
                    chunk = weights_pb2.DownloadChunk(path=e.path, offset=offset, data=block, file_size=e.size,
                                                      file_sha256=e.sha256)
                    if first:
                        chunk.manifest.CopyFrom(m)
                        first = False
                    yield chunk
                    offset += len(block)

    def Heartbeat(self, request: weights_pb2.PodHeartbeat, context: Any) -> weights_pb2.HeartbeatAck:
        with self.owner.lock:
            self.owner.heartbeats.append(request)
        return weights_pb2.HeartbeatAck(promoted_version=request.serving_version,
                                        desired=list(self.owner.desired))


class FileWeightsServer:
    """Serve version folders over the real Weights gRPC API (the subset inference pods use)."""

    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str], weights_pb2.Manifest] = {}
        self.dirs: dict[tuple[str, str], Path] = {}
        self.heartbeats: list[weights_pb2.PodHeartbeat] = []
        self.desired: list[Any] = []           # ModelUpdate orders returned in HeartbeatAck.desired
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        weights_pb2_grpc.add_WeightsServicer_to_server(_WeightsServicer(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add(self, model: str, version: str, src: Path, *, kind: str, base_version: str = "",
            tenant: str = "") -> weights_pb2.Manifest:
        from shared.weights_client import file_entries

        m = weights_pb2.Manifest(model=model, version=version, kind=kind, base_version=base_version, tenant=tenant,
                                 files=file_entries(src), status=weights_pb2.VERSION_STATUS_APPROVED)
        self.manifests[(model, version)] = m
        self.dirs[(model, version)] = Path(src)
        return m

    def last_heartbeat(self) -> weights_pb2.PodHeartbeat | None:
        with self.lock:
            return self.heartbeats[-1] if self.heartbeats else None

    def stop(self) -> None:
        self.server.stop(0)
