"""Versions shared by the inference pods of one host: a version's bytes cross the network once per host.

Without it, N pods on a node each stream, hash and write the same checkpoint at the same moment (a
promotion reaches every pod at once): N times the weights server's bandwidth and N times the CPU, on
the very cores that are serving. With it:

    pod A: lock(version) -> download into <cache>/<model>/<version> (sha256-verified, atomic rename)
           -> hard-link the files into its own version folder -> unlock
    pod B: lock(version) (waits while A downloads) -> the entry is there -> link -> unlock

The cache holds only complete, verified versions (`download_version` renames its `.partial` folder into
place after every file matched the manifest; an interrupted download leaves the `.partial` folder, which
the next pod resumes), and reuses one only for the same files: an entry records the paths, sizes and
sha256 it was verified against, so a version *name* reused for other weights is fetched again. A pod's
own folder holds hard links (a copy across filesystems), so the cache can drop an entry without touching
what a pod is serving. The cache keeps the `keep` newest versions per model; an entry is removed only
under its own lock, never while a pod is linking it.

The lock is `flock` on a file next to the entry: released by the kernel when a pod dies, so a crash in
the middle of a download never blocks the others (the next one resumes the partial folder).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.proto.apprentice.v1 import weights_pb2
from shared.weights.download import DownloadSource, download_version

log = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"
IDENTITY = ".apprentice-files.json"
"""Written into an entry after its download: the files (path, size, sha256) it was verified against."""


@contextmanager
def locked(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An exclusive `flock` on `path` (created if missing) for the block; yields False when `blocking`
    is False and another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class HostCache:
    def __init__(self, root: Path, *, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)

    def fetch(self, source: DownloadSource, model_dir: str, model: str, version_dir: str, version: str,
              dest: Path, *, timeout: float) -> tuple[weights_pb2.Manifest, bool]:
        """`version` of `model` into `dest` (atomic), downloading it only if no pod on this host has yet.
        `model_dir` / `version_dir`: the names as safe path components. Returns (manifest, downloaded)."""
        folder = self.root / model_dir
        entry = folder / version_dir
        with locked(folder / f".{version_dir}{LOCK_SUFFIX}"):
            manifest = source.Get(weights_pb2.GetVersionRequest(model=model, version=version), timeout=timeout)
            downloaded = False
            if not _matches(entry, manifest):
                shutil.rmtree(entry, ignore_errors=True)  # absent, or not what the manifest says: fetch again
                download_version(source, model, version, entry, timeout=timeout)
                (entry / IDENTITY).write_text(_identity(manifest))  # a crash before this: fetched again
                downloaded = True
            os.utime(entry)  # most recently used: the last to be pruned
            link_tree(entry, manifest, dest)
        self.prune(folder, keep_also=version_dir)
        return manifest, downloaded

    def prune(self, folder: Path, *, keep_also: str) -> None:
        """Drop all but the `keep` most recently used entries of one model (and `keep_also`); an entry a
        pod holds the lock of is skipped (it is being downloaded or linked)."""
        used: list[tuple[float, Path]] = []
        for d in folder.iterdir():
            try:
                if d.is_dir() and not d.name.endswith(".partial"):
                    used.append((d.stat().st_mtime, d))
            except OSError:
                continue  # another pod's prune removed it meanwhile
        used.sort(key=lambda x: x[0], reverse=True)
        for _mtime, d in used[self.keep:]:
            if d.name == keep_also:
                continue
            with locked(folder / f".{d.name}{LOCK_SUFFIX}", blocking=False) as got:
                if got:
                    shutil.rmtree(d, ignore_errors=True)
                    log.info("dropped a version from the host cache", extra={"entry": str(d)})


def _identity(manifest: weights_pb2.Manifest) -> str:
    """What makes two versions the same bytes: every file's path, size and sha256 (a name is not enough:
    a reset store, or two stacks on one host, may reuse `v1` for other weights)."""
    return json.dumps(sorted([f.path, f.size, f.sha256] for f in manifest.files))


def _matches(entry: Path, manifest: weights_pb2.Manifest) -> bool:
    """The entry was downloaded for exactly these files (paths, sizes, sha256, recorded next to them after
    the download verified every hash) and still holds each at its size. Nothing writes into an entry
    afterwards (pods link, never write)."""
    try:
        return ((entry / IDENTITY).read_text() == _identity(manifest)
                and all((entry / f.path).stat().st_size == f.size for f in manifest.files))
    except OSError:
        return False


def link_tree(src: Path, manifest: weights_pb2.Manifest, dest: Path) -> None:
    """The manifest's files of `src` into `dest` as hard links (copies across filesystems), atomically:
    built in `<dest>.partial`, renamed into place."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in manifest.files:
        target = tmp / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src / f.path, target)
        except OSError:
            shutil.copyfile(src / f.path, target)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
