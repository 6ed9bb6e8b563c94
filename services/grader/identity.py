"""Settings + host --> the native worker's stable name (its Kafka transactional id and static member id).

Why stable: a worker that dies mid-transaction leaves it open, and read_committed readers of every
partition it wrote to (the graded topic, the state changelog) wait until the transaction ends. A
restarted worker that registers the *same* transactional id aborts it at once (`init_transactions`),
and, as the same static group member, takes its partitions back without a rebalance. A fresh random
id would leave readers waiting for the transaction timeout instead.

The name is `instance_id` when set (one per replica, e.g. a StatefulSet pod name); otherwise the host
name plus the lowest worker slot of the data directory that no live process holds. Slots are file
locks, released by the kernel when their process dies, so `kill -9` + restart gets the same name and
two workers on one host never share one.
"""

from __future__ import annotations

import fcntl
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MAX_SLOTS = 256


@dataclass
class WorkerIdentity:
    name: str
    """Unique among the live workers of one app id; stable across restarts of the same worker."""
    lock: IO[bytes] | None = None
    """The open slot file (held for the life of the process); None when named by `instance_id`."""

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def claim_identity(app_id: str, instance_id: str, datadir: Path) -> WorkerIdentity:
    """`instance_id` if given, else `<host>-<slot>` for the lowest free slot under `datadir`."""
    if instance_id:
        return WorkerIdentity(instance_id)
    datadir.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    for slot in range(MAX_SLOTS):
        f = open(datadir / f"{app_id}.worker-slot-{slot}.lock", "ab")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        return WorkerIdentity(f"{host}-{slot}", f)
    raise RuntimeError(f"all {MAX_SLOTS} worker slots under {datadir} are taken; set APPRENTICE_GRADER_INSTANCE_ID")
