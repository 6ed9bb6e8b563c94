"""Each weights replica's pod heartbeats --> one file per replica in the shared store folder, so that every
replica sees every pod.

Inference pods heartbeat over one long-lived connection, which lands on one weights replica (a Kubernetes
Service balances connections, not calls; a local address list picks the first that answers). Without this,
each replica's Status would list only its own share of the pods, and its canary verdict would count only
their requests. Each replica writes its latest heartbeats (`PodRegistry` entries) to
`<store>/pods/<replica>.json` every couple of seconds (write to a temporary file, then rename: a reader
never sees half a file) and reads the other replicas' files, keeping the newest heartbeat per pod.

A replica that died leaves its file behind: its entries age like any silent pod's and the file is removed
once everything in it is older than the forget period.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from shared.proto.apprentice.v1 import weights_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharedPod:
    """One pod's latest heartbeat as a replica holds it."""

    model: str
    heartbeat: weights_pb2.PodHeartbeat
    received_at: float
    off_target_since: float | None
    owner: str
    trusted: bool

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "heartbeat": base64.b64encode(self.heartbeat.SerializeToString()).decode(),
                "received_at": self.received_at, "off_target_since": self.off_target_since, "owner": self.owner,
                "trusted": self.trusted}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> SharedPod:
        hb = weights_pb2.PodHeartbeat()
        hb.ParseFromString(base64.b64decode(str(d["heartbeat"])))
        since = d.get("off_target_since")
        return cls(str(d["model"]), hb, float(d["received_at"]),  # type: ignore[arg-type]
                   None if since is None else float(since), str(d.get("owner", "")),  # type: ignore[arg-type]
                   bool(d.get("trusted", False)))


class PodShare:
    def __init__(self, directory: Path, replica_id: str, *, cache_s: float = 1.0) -> None:
        """`replica_id`: this replica's file name (unique among the replicas over one store)."""
        self.directory = directory
        self.replica_id = replica_id
        self.cache_s = cache_s
        self._own = directory / f"{_safe(replica_id)}.json"
        self._cached: tuple[float, list[SharedPod]] = (-1e18, [])

    def write(self, pods: list[SharedPod], *, forget_s: float, now: float | None = None) -> None:
        """Replace this replica's file with `pods`; remove other replicas' files silent past `forget_s`."""
        now = time.time() if now is None else now
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._own.with_name(f".{self._own.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"replica": self.replica_id, "written_at": now,
                                   "pods": [p.to_json() for p in pods]}))
        tmp.replace(self._own)
        for f in self.directory.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):
                if f != self._own and now - f.stat().st_mtime > forget_s:
                    f.unlink()

    def peers(self, now: float | None = None) -> list[SharedPod]:
        """The other replicas' pods (read at most once per `cache_s`); an unreadable file counts as empty."""
        now = time.monotonic() if now is None else now
        at, pods = self._cached
        if now - at < self.cache_s:
            return pods
        found: list[SharedPod] = []
        for f in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            if f == self._own:
                continue
            try:
                found += [SharedPod.from_json(d) for d in json.loads(f.read_text())["pods"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("unreadable pod file of another weights replica", extra={"file": str(f), "error": str(e)})
        self._cached = (now, found)
        return found


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "replica"
