"""Which LoRA adapters are resident: loaded on demand in the background, evicted least recently used.

A pod may serve one adapter per tenant, far more than fit in memory at once. An adapter is registered
when its version is loaded (`register`: its files are read and checked then, so a broken adapter fails
the promotion, not a request) and becomes *resident* (copied into its base model's `LoraPool`) only when
a request needs it:
- `ready(v)` on the scheduler thread says whether v's rows may be admitted now; if v is not resident it
  starts a load on the loader thread and says no, so the requesting rows wait while other tenants' rows
  keep decoding (the first request of an adapter never blocks anyone else's);
- `commit()`, on the scheduler thread between steps, copies finished loads into their pool, evicting
  resident adapters least recently used first while the budget (`max_count` adapters, `max_bytes` of
  slot memory; either 0 = no limit) would be exceeded;
- an adapter with rows in flight is never evicted (`acquire` / `release` count them). When a load waits
  for room and every resident adapter is in use, the least recently used one *drains*: no new rows of it
  are admitted until its rows finish and it is evicted, so hot tenants cannot keep a cold one out forever;
- `retire(v)` (the version was unloaded): dropped at once if no request refers to it, otherwise kept,
  in memory, until the last one ends (its files may be deleted right after).
Metrics: apprentice_inference_adapters_resident, _adapter_resident_bytes, _adapter_loads_total{outcome},
_adapter_evictions_total, _adapter_load_seconds (a request finding the adapter absent --> resident).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.inference import metrics
from services.inference.multi_lora import AdapterError, AdapterWeights, LoraPool, load_adapter_weights

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Entry:
    version: str
    path: Path
    pool: LoraPool
    kept: AdapterWeights | None = None     # in memory when its files may be gone (retired while in use)
    staged: AdapterWeights | None = None   # loaded, waiting for a slot
    slot: int = 0                          # > 0 while resident
    loading: bool = False
    wanted_at: float = 0.0                 # when a request found it absent (load seconds start)
    error: str = ""                        # the last load failure, until the waiting requests are told
    rows: int = 0                          # rows in flight
    refs: int = 0                          # requests submitted on it and not done
    last_used: float = 0.0
    draining: bool = False
    retired: bool = False


class AdapterCache:
    """LoRA adapters of any number of versions; at most a budget's worth resident. `register`, `retire`,
    `ref`, `unref` may be called from any thread; the rest from the engine's scheduler thread only."""

    def __init__(self, *, max_count: int = 0, max_bytes: int = 0, max_rank: int = 0, workers: int = 1,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_count, self.max_bytes, self.max_rank = max_count, max_bytes, max_rank
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._loader = ThreadPoolExecutor(max(1, workers), thread_name_prefix="adapter-load")
        self.loads = 0
        self.evictions = 0
        self.load_seconds: deque[float] = deque(maxlen=1024)   # the latest loads' seconds (benchmarks, tests)

    # --- any thread -------------------------------------------------------------------------------------
    def register(self, version: str, path: Path, pool: LoraPool) -> None:
        """Make `version` servable from `path`; reads and checks the files now (raises `AdapterError`)."""
        load_adapter_weights(path, version, pool.linears, dtype=pool.dtype, max_rank=self.max_rank)
        with self._lock:
            old = self._entries.get(version)
            if old is not None and not old.retired:
                return
            if old is not None:                       # re-registered while its last requests finish
                old.retired, old.path, old.kept = False, path, None
                return
            self._entries[version] = _Entry(version, path, pool)
        self._publish()

    def registered(self, version: str) -> bool:
        with self._lock:
            e = self._entries.get(version)
            return e is not None and not e.retired

    def retire(self, version: str) -> None:
        """The version was unloaded: free it once no request refers to it."""
        with self._lock:
            e = self._entries.get(version)
            if e is None:
                return
            e.retired = True
            if e.refs > 0 and e.kept is None and e.staged is not None:
                e.kept = e.staged
            keep = e.refs > 0 and e.kept is None
            path = e.path
        if keep:     # queued requests may still need to (re)load it and its files go away now: hold a copy
            try:
                w = load_adapter_weights(path, version, e.pool.linears, dtype=e.pool.dtype)
            except AdapterError as err:
                log.error("retired adapter could not be kept for its queued requests: %s", err)
                return
            with self._lock:
                e.kept = w
        self._wake()

    def ref(self, version: str) -> None:
        with self._lock:
            e = self._entries.get(version)
            if e is not None:
                e.refs += 1

    def unref(self, version: str) -> None:
        with self._lock:
            e = self._entries.get(version)
            if e is not None:
                e.refs = max(0, e.refs - 1)
                done = e.retired and e.refs == 0
            else:
                done = False
        if done:
            self._wake()

    # --- scheduler thread -----------------------------------------------------------------------------------
    def ready(self, version: str) -> bool:
        """Whether rows of `version` may be admitted now; starts its load if it is not resident."""
        with self._lock:
            e = self._entries.get(version)
            if e is None:
                return False
            if e.slot:
                return not e.draining
            if not e.loading and e.staged is None and not e.error:
                e.loading = True
                e.wanted_at = self._clock()
                self._loader.submit(self._load, e)
            return False

    def failed(self, version: str) -> str:
        """Why `version` cannot become resident ("" while it can): its last load failed, or it is gone."""
        with self._lock:
            e = self._entries.get(version)
            return f"version {version} is no longer loaded here" if e is None else e.error

    def forget_error(self, version: str) -> None:
        """The requests waiting for `version` were failed with its error: the next request tries again."""
        with self._lock:
            e = self._entries.get(version)
            if e is not None:
                e.error = ""

    def slot(self, version: str) -> int:
        return self._entries[version].slot

    def acquire(self, version: str, rows: int = 1) -> int:
        """`rows` rows of `version` were admitted: pin it; its slot."""
        with self._lock:
            e = self._entries[version]
            assert e.slot, f"adapter {version} is not resident"
            e.rows += rows
            e.last_used = self._clock()
            return e.slot

    def release(self, version: str, rows: int = 1) -> None:
        with self._lock:
            e = self._entries.get(version)
            if e is not None:
                e.rows = max(0, e.rows - rows)

    def load_now(self, version: str) -> int:
        """Make `version` resident before returning (the static scheduler, which runs one batch at a time
        and so never has another adapter in use); pins it like `acquire`."""
        while not self.ready(version):
            with self._lock:
                e = self._entries.get(version)
                err = "" if e is None else e.error
            if e is None or err:
                self.forget_error(version)
                raise AdapterError(err or f"version {version} is no longer loaded here")
            self.commit()
            time.sleep(0.002)
        return self.acquire(version)

    def commit(self) -> None:
        """Between steps: free retired adapters, copy finished loads into their pools within the budget."""
        freed = False
        with self._lock:
            for v, e in list(self._entries.items()):
                if e.retired and e.refs == 0 and e.rows == 0:
                    if e.slot:
                        e.pool.clear(e.slot)
                    del self._entries[v]
                    freed = True
            staged = sorted((e for e in self._entries.values() if e.staged is not None), key=lambda e: e.wanted_at)
            if not staged and not freed:
                return
            for e in staged:
                w = e.staged
                assert w is not None
                need = e.pool.slot_bytes(w)
                if self.max_bytes and need > self.max_bytes:
                    e.staged, e.error = None, (f"adapter {e.version} needs {need} bytes of slot memory, more "
                                               f"than the whole adapter budget ({self.max_bytes} bytes)")
                    metrics.ADAPTER_LOADS.labels(outcome="failed").inc()
                    continue
                if not self._make_room(e, w):
                    break
                t0 = self._clock()
                e.slot = e.pool.put(w)
                e.staged = None
                e.last_used = t0
                e.draining = False
                self.loads += 1
                metrics.ADAPTER_LOADS.labels(outcome="loaded").inc()
                self.load_seconds.append(self._clock() - e.wanted_at)
                metrics.ADAPTER_LOAD_SECONDS.observe(self.load_seconds[-1])
            if not any(e.staged is not None for e in self._entries.values()):
                for e in self._entries.values():
                    e.draining = False
        self._publish()

    def _make_room(self, new: _Entry, w: AdapterWeights) -> bool:
        """Evict until `w` fits the budget (caller holds the lock); False if it must wait for rows to end."""
        while self._over_budget(new, w):
            resident = [e for e in self._entries.values() if e.slot]
            idle = [e for e in resident if e.rows == 0]
            if not idle:
                if resident and not any(e.draining for e in resident):
                    min(resident, key=lambda e: e.last_used).draining = True   # no new rows; evicted when idle
                return False
            victim = min(idle, key=lambda e: (e.refs > 0 and not e.draining, e.last_used))
            victim.pool.clear(victim.slot)
            victim.slot, victim.draining = 0, False
            self.evictions += 1
            metrics.ADAPTER_EVICTIONS.inc()
            if victim.retired:
                self._entries.pop(victim.version, None)
        return True

    def _over_budget(self, new: _Entry, w: AdapterWeights) -> bool:
        resident = [e for e in self._entries.values() if e.slot]
        if self.max_count and len(resident) + 1 > self.max_count:
            return True
        return bool(self.max_bytes) and self._bytes(extra=(new.pool, w)) > self.max_bytes

    def _bytes(self, extra: tuple[LoraPool, AdapterWeights] | None = None) -> int:
        """Slot memory of the resident adapters (plus one more, `extra`); caller holds the lock."""
        pools: dict[int, tuple[LoraPool, int]] = {}
        for e in self._entries.values():
            if e.slot:
                pool, n = pools.get(id(e.pool), (e.pool, 0))
                pools[id(e.pool)] = (pool, n + 1)
        total = 0
        for pool, n in pools.values():
            total += n * pool.slot_bytes(extra[1] if extra is not None and extra[0] is pool else None)
        if extra is not None:
            total += extra[0].slot_bytes(extra[1])
        return total

    # --- loader thread ----------------------------------------------------------------------------------------
    def _load(self, e: _Entry) -> None:
        try:
            w = e.kept if e.kept is not None else load_adapter_weights(
                e.path, e.version, e.pool.linears, dtype=e.pool.dtype, max_rank=self.max_rank)
        except Exception as err:  # noqa: BLE001 - the waiting requests fail with the cause; the engine goes on
            log.error("adapter load failed: %s", err, extra={"version": e.version})
            metrics.ADAPTER_LOADS.labels(outcome="failed").inc()
            with self._lock:
                e.loading, e.error = False, f"{type(err).__name__}: {err}"
        else:
            with self._lock:
                e.loading, e.staged = False, w
        self._wake()

    # --- reporting ------------------------------------------------------------------------------------------
    def resident(self) -> list[str]:
        with self._lock:
            return sorted(v for v, e in self._entries.items() if e.slot)

    def resident_bytes(self) -> int:
        with self._lock:
            return self._bytes()

    def _publish(self) -> None:
        with self._lock:
            n = sum(1 for e in self._entries.values() if e.slot)
            b = self._bytes()
        metrics.ADAPTERS_RESIDENT.set(n)
        metrics.ADAPTER_RESIDENT_BYTES.set(b)

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
