"""Weights.Download throughput on loopback vs a raw file copy of the same bytes, in one run.

    python load/weights_download_bench.py                      # SmolLM2-135M's weights if cached, else 256 MiB
    python load/weights_download_bench.py --size-mb 538 --repeats 5 --chunk-mb 1 --streams 2

The server runs in its own process (as in production: the client's hashing does not share its GIL).
Every repeat measures, on the same stored bytes (the source is in the page cache for all rows: it was
just uploaded, and every row reads it again), each row writing fresh files on the same filesystem:
- raw copy:          shutil.copyfile of each stored blob (the kernel copies page cache to page cache;
                     the bytes never enter user space; nothing is hashed; no fsync);
- raw copy + fsync:  the same, then fsync of every file and of the folder (durable, like the download);
- Download:          what an inference pod runs on a hot swap: shared.weights.download.download_version
                     through a DownloadClient (one connection per stream): stream, pwrite at each chunk's
                     offset, sha256 of every file verified against the manifest, fsync once per file and
                     folder, atomic rename into place;
- Download, no fsync: the same with durable=False (the bytes reach the page cache only, like raw copy);
- Download, stub:    the same through a plain WeightsStub (protobuf-parsed chunks, one stream) for reference;
- stream only:       the gRPC stream alone (DownloadClient, one stream), bytes discarded;
- local sha256:      hashing the stored blob from the page cache, no network (the floor for any client
                     that verifies: sha256 of one file runs on one core).
Rows alternate order between repeats, and the disk is synced (untimed) after each row's files are
deleted and the disk has gone idle (`settle_disk`: writeback and ext4 discards of the deleted blocks), so
no row pays for another's I/O. Prints a table of medians and the throughput ratios.
The target (>= 0.5x) is checked on two like-for-like pairs: Download / raw copy + fsync (both durable)
and Download-no-fsync / raw copy (both page cache only); the second cannot exceed local sha256 / raw copy
(printed). Exit code 1 when either pair is below target.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import multiprocessing.queues
import multiprocessing.synchronize
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 0.5


def _serve(store_dir: str, chunk_size: int, port_q: multiprocessing.queues.Queue[int],
           stop: multiprocessing.synchronize.Event) -> None:
    os.environ["APPRENTICE_TOPIC_PREFIX"] = "bench-unused."
    from services.weights.service import start
    from services.weights.settings import LocalStoreSettings, WeightsSettings

    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=Path(store_dir)),
                               chunk_size=chunk_size, max_chunk_size=max(chunk_size, 16 << 20), policy="manual")
    running = start(settings, consume=False)
    port_q.put(running.port)
    stop.wait()
    running.stop(grace=1.0)


def _source_files(args: argparse.Namespace, tmp: Path) -> tuple[Path, str]:
    if args.size_mb is None:
        try:
            from shared.models import SMOLLM2, default_cache

            src = default_cache() / SMOLLM2
            if (src / "model.safetensors").exists():
                out = tmp / "src"
                out.mkdir()
                for name in ("model.safetensors", "config.json", "generation_config.json"):
                    if (src / name).exists():
                        os.link(src / name, out / name) if os.stat(src).st_dev == os.stat(tmp).st_dev \
                            else shutil.copyfile(src / name, out / name)
                return out, "SmolLM2-135M-Instruct fp32 weights"
        except Exception:  # noqa: BLE001 - fall back to synthetic bytes
            pass
        args.size_mb = 256
    out = tmp / "src"
    out.mkdir()
    with open(out / "model.safetensors", "wb") as f:
        for _ in range(args.size_mb):
            f.write(os.urandom(1 << 20))
    return out, f"{args.size_mb} MiB of random bytes"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(blobs: list[Path], dest: Path, *, durable: bool) -> None:
    dest.mkdir()
    for j, blob in enumerate(blobs):
        shutil.copyfile(blob, dest / f"f{j}")
        if durable:
            _fsync(dest / f"f{j}")
    if durable:
        _fsync(dest)
        _fsync(dest.parent)


def _device_stat(path: Path) -> Path | None:
    """/sys/dev/block/<major>:<minor>/stat of the block device holding `path`, if there is one."""
    st = os.stat(path)
    p = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    return p if p.exists() else None


def settle_disk(path: Path, *, quiet_s: float = 0.5, timeout_s: float = 15.0) -> None:
    """Flush, then wait until the disk under `path` has been idle for `quiet_s` (no I/O in flight and no
    counter moving). Deleting a file that was synced makes ext4 mounted with `discard` send the freed
    blocks to the device after the journal commit, asynchronously: measured here, a durable row that
    ran while the previous row's 538 MB were being discarded took 2-2.6 s instead of 0.8 s."""
    os.sync()
    stat = _device_stat(path)
    if stat is None:
        return
    deadline = time.monotonic() + timeout_s
    last, since = stat.read_text().split(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = stat.read_text().split()
        if now != last or now[8] != "0":  # field 9: requests in flight
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def _local_sha256(blobs: list[Path]) -> None:
    for blob in blobs:
        h = hashlib.sha256()
        with open(blob, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=None, help="synthetic payload (MiB) instead of SmolLM2's weights")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-mb", type=float, default=None, help="server chunk size in MiB (default: the server's)")
    ap.add_argument("--streams", type=int, default=1, help="parallel range streams per large file (pods use 1)")
    ap.add_argument("--no-stub", action="store_true", help="skip the plain-stub reference row (slow on 2 cores)")
    ap.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args(argv)

    import grpc

    from services.weights.settings import WeightsSettings
    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
    from shared.weights.client import upload_version
    from shared.weights.download import DownloadClient, download_version

    streams = max(1, args.streams)
    chunk = int(args.chunk_mb * (1 << 20)) if args.chunk_mb else WeightsSettings.model_fields["chunk_size"].default
    tmp = Path(tempfile.mkdtemp(prefix="weights-bench-", dir=args.workdir))
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(str(tmp / "store"), chunk, port_q, stop))
    server.start()
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[..., object], *a: object, **kw: object) -> None:
        t0 = time.perf_counter()
        fn(*a, **kw)
        times.setdefault(name, []).append(time.perf_counter() - t0)

    try:
        port = port_q.get(timeout=120)
        src, what = _source_files(args, tmp)
        total = sum(p.stat().st_size for p in src.iterdir())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 << 20),
                                                                       ("grpc.max_send_message_length", 64 << 20)])
        stub = weights_pb2_grpc.WeightsStub(channel)
        t0 = time.perf_counter()
        m = upload_version(stub, weights_pb2.UploadHeader(model="bench", kind="full"), src)
        upload_s = time.perf_counter() - t0
        blobs = [tmp / "store" / "blobs" / f.sha256[:2] / f.sha256 for f in m.files]
        client = DownloadClient(f"127.0.0.1:{port}", connections=streams)
        single = DownloadClient(f"127.0.0.1:{port}")
        big = max(m.files, key=lambda f: f.size)

        def stream_only() -> None:
            got = sum(len(c.data) for c in single.Download(weights_pb2.DownloadRequest(
                model="bench", version=m.version, path=big.path)))
            assert got == big.size, f"stream returned {got} of {big.size} bytes"

        for i in range(args.repeats):
            rows: list[tuple[Any, ...]]  # (name, function, positional arguments..., keyword arguments)
            rows = [("raw copy", _copy, blobs, tmp / "c", {"durable": False}),
                    ("raw copy + fsync", _copy, blobs, tmp / "c", {"durable": True}),
                    ("Download (pod path)", download_version, client, "bench", m.version, tmp / "d",
                     {"streams": streams}),
                    ("Download, no fsync", download_version, client, "bench", m.version, tmp / "d",
                     {"streams": streams, "durable": False})]
            if not args.no_stub:
                rows.append(("Download, plain stub", download_version, stub, "bench", m.version, tmp / "d",
                             {"streams": 1}))
            if i % 2:
                rows.reverse()  # neither side always runs right after the other's writeback
            for name, fn, *a, kw in rows:
                timed(name, fn, *a, **kw)
                shutil.rmtree(tmp / "c", ignore_errors=True)
                shutil.rmtree(tmp / "d", ignore_errors=True)
                settle_disk(tmp)  # untimed: the deleted files' writeback/discard must not land in the next row
            timed("stream only (1 stream)", stream_only)
            timed("local sha256 (no network)", _local_sha256, blobs)
        client.close()
        single.close()
        channel.close()
    finally:
        stop.set()
        server.join(30)
        shutil.rmtree(tmp, ignore_errors=True)

    mb = total / 1e6
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"payload: {what}, {mb:.1f} MB in {len(m.files)} files; server chunk {chunk / (1 << 20):g} MiB; "
          f"{streams} stream(s) per large file; {args.repeats} repeats (medians); {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'path':<28} {'seconds':>9} {'MB/s':>9}   all runs (s)")
    for name, v in times.items():
        print(f"{name:<28} {med[name]:>9.3f} {mb / med[name]:>9.1f}   {' '.join(f'{x:.2f}' for x in v)}")
    print(f"{'Upload (once)':<28} {upload_s:>9.3f} {mb / upload_s:>9.1f}")
    durable = med["raw copy + fsync"] / med["Download (pod path)"]
    cached = med["raw copy"] / med["Download, no fsync"]
    mixed = med["raw copy"] / med["Download (pod path)"]
    ok = durable >= TARGET and cached >= TARGET
    print(f"Download / raw copy, both durable (fsync)      = {durable:.2f}x (target >= {TARGET}x): "
          f"{'PASS' if durable >= TARGET else 'FAIL'}")
    print(f"Download / raw copy, both page cache (no fsync) = {cached:.2f}x (target >= {TARGET}x): "
          f"{'PASS' if cached >= TARGET else 'FAIL'}")
    print(f"Download (durable) / raw copy (no fsync)       = {mixed:.2f}x (for reference: unequal work)")
    print(f"stream only / raw copy = {med['raw copy'] / med['stream only (1 stream)']:.2f}x; "
          f"local sha256 / raw copy = {med['raw copy'] / med['local sha256 (no network)']:.2f}x "
          "(the ceiling for a verifying client)")
    print(f"verdict (both pairs): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
