"""Weights.Download throughput on loopback vs a raw file copy of the same bytes, in one run.

    python load/weights_download_bench.py                      # SmolLM2-135M's weights if cached, else 256 MB
    python load/weights_download_bench.py --size-mb 512 --repeats 5 --chunk-mb 1

The server runs in its own process (as in production: the client's hashing does not share its GIL).
Measured per repeat, on the same bytes:
- raw copy:  shutil.copyfile of the stored blob to a new file (the baseline: what `cp` costs; the kernel
             copies page cache to page cache without the bytes entering user space);
- user copy: the same copy through user space (read/write 4 MiB blocks), for reference;
- download:  shared.weights_client.download_version (stream, write, sha256-verify, atomic rename) —
             what an inference pod does on a hot swap;
- pipelined: the same stream, written and sha256-hashed on the fly in a second thread (hashlib and file
             writes release the GIL) instead of hashing the file again afterwards: a proposal for
             weights_client, measured so its gain is known;
- stream:    the gRPC stream alone, bytes discarded (where the time goes).
Prints a table of medians and the ratio download / raw copy (target >= 0.5); exit code 1 below target.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 0.5


def _serve(store_dir: str, chunk_size: int, port_q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    os.environ["APPRENTICE_TOPIC_PREFIX"] = "bench-unused."
    from services.weights.config import WeightsSettings
    from services.weights.server import start

    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store_dir=Path(store_dir),
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
    return out, f"{args.size_mb} MB of random bytes"


def pipelined_download(stub: Any, model: str, version: str, dest: Path) -> int:
    """Download every file of a version, hashing while writing in a second thread; verify; return bytes."""
    import hashlib
    import queue

    from shared.proto.apprentice.v1 import weights_pb2

    dest.mkdir(parents=True)
    q: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=8)
    hashes: dict[str, Any] = {}
    errors: list[BaseException] = []

    def writer() -> None:
        files: dict[str, Any] = {}
        try:
            while (item := q.get()) is not None:
                path, data = item
                if path not in files:
                    files[path] = open(dest / path, "wb")  # noqa: SIM115 - closed below
                    hashes[path] = hashlib.sha256()
                files[path].write(data)
                hashes[path].update(data)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            errors.append(e)
        finally:
            for f in files.values():
                f.close()

    t = threading.Thread(target=writer)
    t.start()
    total, expected = 0, {}
    for chunk in stub.Download(weights_pb2.DownloadRequest(model=model, version=version)):
        expected[chunk.path] = chunk.file_sha256
        data = chunk.data
        q.put((chunk.path, data))
        total += len(data)
    q.put(None)
    t.join()
    if errors:
        raise errors[0]
    bad = [p for p, h in hashes.items() if h.hexdigest() != expected[p]]
    assert not bad, f"sha256 mismatch: {bad}"
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=None, help="synthetic payload instead of SmolLM2's weights")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-mb", type=float, default=4.0, help="server chunk size in MiB")
    ap.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args(argv)

    import grpc

    from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
    from shared.weights_client import download_version, upload_version

    tmp = Path(tempfile.mkdtemp(prefix="weights-bench-", dir=args.workdir))
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(str(tmp / "store"), int(args.chunk_mb * (1 << 20)), port_q, stop))
    server.start()
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
        blobs = [(tmp / "store" / "blobs" / f.sha256[:2] / f.sha256, f.size) for f in m.files]

        copy_s, user_copy_s, download_s, pipelined_s, stream_s = [], [], [], [], []
        for i in range(args.repeats):
            dest = tmp / f"copy{i}"
            dest.mkdir()
            t0 = time.perf_counter()
            for j, (blob, _size) in enumerate(blobs):
                shutil.copyfile(blob, dest / f"f{j}")
            copy_s.append(time.perf_counter() - t0)
            shutil.rmtree(dest)
            dest.mkdir()
            t0 = time.perf_counter()
            for j, (blob, _size) in enumerate(blobs):
                with open(blob, "rb") as fin, open(dest / f"f{j}", "wb") as fout:
                    while block := fin.read(4 << 20):
                        fout.write(block)
            user_copy_s.append(time.perf_counter() - t0)
            shutil.rmtree(dest)

            t0 = time.perf_counter()
            download_version(stub, "bench", m.version, tmp / f"dl{i}")
            download_s.append(time.perf_counter() - t0)
            shutil.rmtree(tmp / f"dl{i}")

            t0 = time.perf_counter()
            assert pipelined_download(stub, "bench", m.version, tmp / f"pl{i}") == total
            pipelined_s.append(time.perf_counter() - t0)
            shutil.rmtree(tmp / f"pl{i}")

            t0 = time.perf_counter()
            got = sum(len(c.data) for c in stub.Download(weights_pb2.DownloadRequest(model="bench", version=m.version)))
            stream_s.append(time.perf_counter() - t0)
            assert got == total, f"stream returned {got} of {total} bytes"
        channel.close()
    finally:
        stop.set()
        server.join(30)
        shutil.rmtree(tmp, ignore_errors=True)

    mb = total / 1e6
    rows = [("raw copy (baseline)", statistics.median(copy_s)),
            ("user-space copy (reference)", statistics.median(user_copy_s)),
            ("Download via weights_client", statistics.median(download_s)),
            ("Download, pipelined hashing", statistics.median(pipelined_s)),
            ("Download stream only", statistics.median(stream_s)), ("Upload (once)", upload_s)]
    print(f"payload: {what}, {mb:.1f} MB in {len(m.files)} files; chunk {args.chunk_mb:g} MiB; "
          f"{args.repeats} repeats (medians); {os.cpu_count()} CPUs")
    print(f"{'path':<30} {'seconds':>9} {'MB/s':>9}")
    for name, s in rows:
        print(f"{name:<30} {s:>9.3f} {mb / s:>9.1f}")
    ratio = statistics.median(copy_s) / statistics.median(download_s)
    pipelined = statistics.median(copy_s) / statistics.median(pipelined_s)
    stream = statistics.median(copy_s) / statistics.median(stream_s)
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(f"stream only / raw copy = {stream:.2f}x (the transport alone: no write, no sha256)")
    print(f"pipelined-hashing client / raw copy = {pipelined:.2f}x (a proposal, not what pods run)")
    print(f"download / raw copy throughput = {ratio:.2f}x (target >= {TARGET}x): {verdict}")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
