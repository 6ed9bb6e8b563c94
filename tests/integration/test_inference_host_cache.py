"""The inference pods' host cache over a real Weights server on loopback: pods of one host download a
version once and hard-link it; a damaged entry is fetched again; pruning keeps the newest entries, skips
a locked one, and never touches what a pod links to."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.inference.host_cache import HostCache, locked
from services.weights.service import RunningServer, start
from services.weights.settings import LocalStoreSettings, WeightsSettings
from shared.proto.apprentice.v1 import weights_pb2
from shared.weights.client import sha256_file, upload_version
from shared.weights.download import DownloadClient

pytestmark = pytest.mark.integration
MODEL = "tiny-random"


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", f"test-{uuid.uuid4().hex[:8]}.")  # no Kafka traffic here
    running = start(WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"),
                                    policy="manual"), consume=False)
    yield running
    running.stop(grace=1.0)


@pytest.fixture
def client(server: RunningServer) -> Iterator[DownloadClient]:
    with DownloadClient(f"127.0.0.1:{server.port}") as c:
        yield c


def upload(client: DownloadClient, server: RunningServer, tmp_path: Path, seed: int) -> weights_pb2.Manifest:
    import grpc

    from shared.proto.apprentice.v1 import weights_pb2_grpc

    src = tmp_path / f"src-{seed}"
    (src / "sub").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (src / "sub" / "config.json").write_text(f'{{"seed": {seed}}}')
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        return upload_version(weights_pb2_grpc.WeightsStub(ch), weights_pb2.UploadHeader(model=MODEL, kind="full"),
                              src)


def fetch(cache: HostCache, client: DownloadClient, version: str, dest: Path) -> bool:
    _m, downloaded = cache.fetch(client, MODEL, MODEL, version, version, dest, timeout=60)
    return downloaded


def test_pods_of_one_host_download_once_and_link(client: DownloadClient, server: RunningServer,
                                                 tmp_path: Path) -> None:
    m = upload(client, server, tmp_path, 1)
    cache = HostCache(tmp_path / "cache")
    pods = [tmp_path / f"pod-{i}" / m.version for i in range(4)]
    results: list[bool] = []
    threads = [threading.Thread(target=lambda d=d: results.append(fetch(cache, client, m.version, d)))
               for d in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [False, False, False, True]  # one download; the others waited, then linked
    entry = tmp_path / "cache" / MODEL / m.version
    for pod in pods:
        for f in m.files:
            assert sha256_file(pod / f.path) == f.sha256
            assert (pod / f.path).stat().st_ino == (entry / f.path).stat().st_ino  # a link, not a copy
        assert not pod.with_name(pod.name + ".partial").exists()


def test_a_damaged_entry_is_fetched_again(client: DownloadClient, server: RunningServer, tmp_path: Path) -> None:
    m = upload(client, server, tmp_path, 2)
    cache = HostCache(tmp_path / "cache")
    assert fetch(cache, client, m.version, tmp_path / "pod-a" / m.version)
    big = max(m.files, key=lambda f: f.size)
    entry_file = tmp_path / "cache" / MODEL / m.version / big.path
    entry_file.unlink()
    entry_file.write_bytes(b"truncated")  # a new inode: the pod's link keeps the verified bytes
    assert fetch(cache, client, m.version, tmp_path / "pod-b" / m.version)
    assert sha256_file(tmp_path / "pod-b" / m.version / big.path) == big.sha256
    assert sha256_file(tmp_path / "pod-a" / m.version / big.path) == big.sha256


def test_prune_keeps_the_newest_and_skips_locked_entries(client: DownloadClient, server: RunningServer,
                                                         tmp_path: Path) -> None:
    versions = [upload(client, server, tmp_path, s).version for s in (10, 11, 12, 13)]
    cache = HostCache(tmp_path / "cache", keep=2)
    folder = tmp_path / "cache" / MODEL
    fetch(cache, client, versions[0], tmp_path / "pod" / versions[0])
    fetch(cache, client, versions[1], tmp_path / "pod" / versions[1])
    os.utime(folder / versions[0], (1, 1))  # the oldest
    os.utime(folder / versions[1], (2, 2))
    with locked(folder / f".{versions[0]}.lock"):  # a pod is linking the oldest one right now
        fetch(cache, client, versions[2], tmp_path / "pod" / versions[2])
        assert (folder / versions[0]).exists()  # beyond `keep`, but locked: skipped
    assert (folder / versions[1]).exists()  # the second newest
    fetch(cache, client, versions[3], tmp_path / "pod" / versions[3])  # unlocked now: both old ones go
    assert sorted(d.name for d in folder.iterdir() if d.is_dir()) == sorted(versions[2:])
    for v in versions:  # the pod's own links survive every prune
        assert (tmp_path / "pod" / v / "model.safetensors").stat().st_size == 3 << 20


def test_a_version_name_reused_for_other_weights_is_fetched_again(client: DownloadClient, server: RunningServer,
                                                                   tmp_path: Path) -> None:
    """A reset store (or a second stack on the host) may call other weights `v1` again: same name, same
    sizes, other bytes. The cache must tell them apart by their sha256, not by name or size."""
    first = upload(client, server, tmp_path, 20)
    cache = HostCache(tmp_path / "cache")
    assert fetch(cache, client, first.version, tmp_path / "pod-a" / first.version)
    other = start(WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store-2"),
                                  policy="manual"), consume=False)
    try:
        with DownloadClient(f"127.0.0.1:{other.port}") as client2:
            second = upload(client2, other, tmp_path / "second", 20)
            assert second.version == first.version
            assert {f.sha256 for f in second.files} != {f.sha256 for f in first.files}
            assert fetch(cache, client2, second.version, tmp_path / "pod-b" / second.version)  # downloaded again
            for f in second.files:
                assert sha256_file(tmp_path / "pod-b" / second.version / f.path) == f.sha256
    finally:
        other.stop(grace=1.0)
