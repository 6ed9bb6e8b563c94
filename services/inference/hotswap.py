"""ModelUpdate orders (Kafka, or a heartbeat's catch-up list) --> downloaded, loaded versions --> routing.

Three parts, each on its own thread so that none of them is on the serving path:
- `VersionManager.apply` folds orders into a routing table, fetches what the new table needs through
  `Weights.Download` (streamed, sha256-verified by `shared.weights.download`), has the engine load it,
  and only then publishes the table. A version that fails to download or load leaves its slot on the
  old version; the failure is logged, counted and reported as `last_error` in the next heartbeat.
- `UpdateFollower` reads `model-updates` from the beginning with a group of its own (every pod must see
  every order), so a restarted pod rebuilds the current table from the log and loads only its result.
- `Heartbeater` reports what the pod serves to `Weights.Heartbeat` every few seconds; the ack lists
  what the pod *should* serve, which repairs a pod that missed orders (applied only when two
  consecutive acks agree and no Kafka order arrived in between, so an ack that races an order is not
  mistaken for the truth). An unreachable weights service is logged, never fatal.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from services.inference import metrics
from services.inference.engines.base import BASE_VERSION, Engine, VersionFiles
from services.inference.host_cache import HostCache
from services.inference.routing import RoutingTable
from services.inference.settings import InferenceSettings
from shared.contracts.events import UndecodableEvent, timestamp
from shared.contracts.orders import OPERATOR, InvalidOrder, Slot
from shared.contracts.validation import decode_record
from shared.kafka.consumer import EventConsumer
from shared.kafka.deadletter import DeadLetterPublisher
from shared.kafka.trust import RecordTrust, UntrustedRecord
from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc
from shared.retry import Backoff
from shared.security.channels import open_channel
from shared.weights.download import DownloadClient, download_version

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def path_slug(name: str) -> str:
    """A model or version name as one safe path component (names may be paths or hub ids)."""
    slug = _UNSAFE.sub("_", name).strip(".") or "_"
    return slug[:120]


def versions_root(settings: InferenceSettings) -> Path:
    """Where this pod keeps the downloaded versions of its model."""
    return settings.versions_path / path_slug(settings.common.model)


class VersionManager:
    def __init__(self, settings: InferenceSettings, engine: Engine, *, advertised_endpoint: str = "") -> None:
        self.settings = settings
        self.engine = engine
        self.model = settings.common.model
        self.advertised_endpoint = advertised_endpoint
        self.table = RoutingTable()                   # replaced atomically; requests read it lock-free
        self.last_error = ""
        self.applied_at = 0.0                         # monotonic time of the last Kafka order applied
        self._files: dict[str, VersionFiles] = {}
        self._apply_lock = threading.Lock()
        self._clients: dict[str, DownloadClient] = {}
        self._canary_counts: dict[str, list[int]] = {}   # canary version -> [requests, errors]
        self._counts_lock = threading.Lock()
        self._rng = random.Random()
        self._publish_metrics()

    # --- the request path -------------------------------------------------------------------------
    def route(self, tenant: str) -> tuple[str, bool]:
        return self.table.choose(tenant, self._rng.random())

    def note_result(self, version: str, canary: bool, ok: bool) -> None:
        """Count canary traffic for the weights service's canary policy (reported in heartbeats)."""
        if canary:
            with self._counts_lock:
                counts = self._canary_counts.setdefault(version, [0, 0])
                counts[0] += 1
                counts[1] += 0 if ok else 1

    @property
    def applying(self) -> bool:
        """An order or catch-up is being applied (downloading or loading) right now."""
        return self._apply_lock.locked()

    # --- orders -----------------------------------------------------------------------------------
    def apply(self, updates: Sequence[events_pb2.ModelUpdate], *, source: str = "kafka") -> None:
        """Fold orders for this model into the table, load what it needs, publish it."""
        mine = [u for u in updates if u.model == self.model]
        if not mine:
            return
        with self._apply_lock:
            desired = self.table
            endpoints: dict[str, str] = {}
            for u in mine:
                try:
                    desired = desired.apply(u)
                except InvalidOrder as e:
                    log.error("model update ignored: %s", e, extra={"event_id": u.envelope.event_id})
                    continue
                for v in (u.version, u.base_version):
                    if v and u.weights_endpoint:
                        endpoints[v] = u.weights_endpoint
                log.info("model update", extra={"action": events_pb2.UpdateAction.Name(u.action),
                                                 "version": u.version, "tenant": u.tenant, "source": source,
                                                 "reason": u.reason})
            self._reconcile(desired, endpoints)
            if source == "kafka":
                self.applied_at = time.monotonic()

    def converge(self, target: RoutingTable) -> None:
        """Make the table equal `target` (heartbeat catch-up), keeping rollback history."""
        with self._apply_lock:
            slots = {t: replace(s, history=self.table.slots.get(t, Slot()).history)
                     for t, s in target.slots.items()}
            self._reconcile(RoutingTable(slots), {})

    def _reconcile(self, desired: RoutingTable, endpoints: dict[str, str]) -> None:
        old = self.table
        failed: dict[str, str] = {}
        new_versions = sorted(desired.versions() - set(self.engine.loaded_versions()))
        limit = self.engine.max_full_versions
        if limit is not None and new_versions:
            failed.update(self._over_full_limit(desired, new_versions, endpoints, limit))
        for v in new_versions:
            if v in failed:
                continue
            try:
                self._ensure_loaded(v, endpoints, desired.slots_using(v), depth=0)
            except Exception as e:  # noqa: BLE001 - any failure keeps the old version
                failed[v] = f"{type(e).__name__}: {e}"
        if failed:
            metrics.SWAPS.labels(outcome="failed").inc(len(failed))   # download, verify, tenant or load
            desired = desired.revert(set(failed), old)
            self.last_error = "; ".join(f"{v}: {why}" for v, why in sorted(failed.items()))[:2000]
            log.error("version load failed, keeping the previous version", extra={"errors": self.last_error})
        with self._counts_lock:
            for t, (v, _f) in desired.tenant_canaries().items():
                if old.slots.get(t, Slot()).canary != v:
                    self._canary_counts[v] = [0, 0]
        self.table = desired
        self._publish_metrics()
        self._unload_unused()

    def _over_full_limit(self, desired: RoutingTable, new_versions: list[str], endpoints: dict[str, str],
                         limit: int) -> dict[str, str]:
        """Engines that hold a single set of full weights (vLLM) can serve several versions at once only
        as LoRA adapters of those weights: refuse tables that would need more."""
        fulls: set[str] = set()
        for v in desired.versions():
            if v == BASE_VERSION:
                fulls.add(v)
                continue
            try:
                f = self._fetch(v, endpoints.get(v, self.settings.weights_endpoint))
            except Exception:  # noqa: BLE001 - reported by the load attempt
                continue
            fulls.add(v if f.kind != "lora" else (f.base_version or BASE_VERSION))
        if len(fulls) <= limit:
            return {}
        why = (f"the {self.engine.name} engine serves {limit} set(s) of full weights at a time, this order needs "
               f"{sorted(fulls)}; canary and tenant versions must be LoRA adapters of the promoted weights")
        return {v: why for v in new_versions}

    def _ensure_loaded(self, version: str, endpoints: dict[str, str], slots: Iterable[str], depth: int) -> None:
        if version in self.engine.loaded_versions():
            return
        t0 = time.monotonic()
        files = self._fetch(version, endpoints.get(version, self.settings.weights_endpoint))
        for slot in slots:
            if files.tenant not in ("", slot):
                raise PermissionError(f"version {version} was trained on tenant {files.tenant!r}'s data and "
                                      f"cannot serve slot {slot or '*'!r}")
        if files.kind == "lora" and files.base_version not in ("", BASE_VERSION):
            if depth > 0:
                raise ValueError(f"LoRA {version} applies to {files.base_version}, itself not full weights")
            self._ensure_loaded(files.base_version, endpoints, slots, depth + 1)
        t1 = time.monotonic()
        self.engine.load_version(files)
        metrics.SWAPS.labels(outcome="loaded").inc()
        metrics.LOAD_SECONDS.observe(time.monotonic() - t0)
        log.info("version ready", extra={"version": version, "kind": files.kind,
                                         "load_seconds": round(time.monotonic() - t1, 3),
                                         "seconds": round(time.monotonic() - t0, 3)})
        self.last_error = ""

    def _fetch(self, version: str, endpoint: str) -> VersionFiles:
        if version in self._files and self._files[version].path.exists():
            return self._files[version]
        s = self.settings
        dest = versions_root(s) / path_slug(version)
        t0 = time.monotonic()
        downloaded = True
        if s.host_cache:
            manifest, downloaded = HostCache(s.host_cache_path, keep=s.host_cache_keep).fetch(
                self._client(endpoint), path_slug(self.model), self.model, path_slug(version), version, dest,
                timeout=s.download_timeout_s)
        else:
            manifest = download_version(self._client(endpoint), self.model, version, dest,
                                        timeout=s.download_timeout_s)
        files = VersionFiles(version=version, kind=manifest.kind or "full", path=dest,
                             base_version=manifest.base_version or BASE_VERSION, tenant=manifest.tenant)
        self._files[version] = files
        log.info("version downloaded" if downloaded else "version linked from the host cache",
                 extra={"version": version, "kind": files.kind, "bytes": sum(f.size for f in manifest.files),
                        "seconds": round(time.monotonic() - t0, 3)})
        return files

    def _client(self, endpoint: str) -> DownloadClient:
        """One download client per weights endpoint (hand-decoded chunks: see shared.weights.wire)."""
        if endpoint not in self._clients:
            self._clients[endpoint] = DownloadClient(endpoint)
        return self._clients[endpoint]

    def _unload_unused(self) -> None:
        keep = self.table.versions()
        keep |= {self._files[v].base_version for v in keep if v in self._files and self._files[v].kind == "lora"}
        for v in self.engine.loaded_versions():
            if v not in keep and v != BASE_VERSION:
                self.engine.unload_version(v)
                files = self._files.pop(v, None)
                if files is not None:
                    shutil.rmtree(files.path, ignore_errors=True)
                log.info("version unloaded", extra={"version": v})

    def _publish_metrics(self) -> None:
        metrics.SERVED_VERSION.clear()
        for t, v in self.table.tenant_versions().items():
            metrics.SERVED_VERSION.labels(tenant=t or "*", version=v, role="promoted").set(1)
        for t, (v, f) in self.table.tenant_canaries().items():
            metrics.SERVED_VERSION.labels(tenant=t or "*", version=v, role="canary").set(f)

    # --- heartbeat --------------------------------------------------------------------------------
    def heartbeat(self) -> weights_pb2.PodHeartbeat:
        table = self.table
        canaries = table.tenant_canaries()
        op = table.slots.get(OPERATOR, Slot(promoted=BASE_VERSION))
        c_version, c_fraction = (op.canary, op.canary_fraction) if op.canary else next(iter(sorted(canaries.values())),
                                                                               ("", 0.0))
        with self._counts_lock:
            counts = list(self._canary_counts.get(c_version, [0, 0]))
        return weights_pb2.PodHeartbeat(
            pod_id=self.settings.pod_id, model=self.model, serving_version=op.promoted or BASE_VERSION,
            canary_version=c_version, canary_fraction=c_fraction, endpoint=self.advertised_endpoint,
            last_error=self.last_error, sent_at=timestamp(), tenant_versions=table.tenant_versions(),
            tenant_canaries={t: v for t, (v, _f) in canaries.items()}, canary_requests=counts[0],
            canary_errors=counts[1])

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


class UpdateFollower:
    """model-updates (Kafka) --> VersionManager.apply, on a background thread.

    Every order must be signed by a principal allowed to write model updates (weights) and not be an old
    order replayed after a newer one of its key (`RecordTrust`, monotonic: shared/kafka/trust.py). A
    refused order is never applied (the pod keeps serving what it serves) and goes to the dead-letter
    topic with its reason (stage "inference.hotswap"): a forged order is an attack to be seen, once per
    pod that saw it."""

    def __init__(self, settings: InferenceSettings, manager: VersionManager, *,
                 dead: DeadLetterPublisher | None = None) -> None:
        self.settings = settings
        self.manager = manager
        self.dead = dead
        self.trust = RecordTrust.from_settings(settings.common, monotonic=True)
        self.caught_up = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="model-updates", daemon=True)

    def start(self) -> UpdateFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        topic = self.settings.common.topics.model_updates
        group = self.settings.common.topics.group_id(f"inference-{self.settings.pod_id}-{uuid.uuid4().hex[:8]}")
        consumer = EventConsumer(self.settings.common.kafka_bootstrap, group, [topic], log_level=3)
        backoff = Backoff(1.0, 5.0)
        try:
            while not self._stop.is_set():
                try:
                    # Wait for one record, then take what else is already there: a batch wait would hold
                    # every order until its timeout (consume() returns early only for a full batch),
                    # while a restart still folds the whole log into one table and loads only its result.
                    msgs = consumer.poll_batch(max_records=1, timeout=0.5)
                    if msgs:
                        msgs += consumer.poll_batch(max_records=199, timeout=0)
                    backoff.reset()
                except Exception:  # noqa: BLE001 - keep following; the broker may come back
                    log.exception("model-updates poll failed")
                    self._stop.wait(backoff.next())
                    continue
                if not msgs:
                    if consumer.assignment():
                        self.caught_up.set()
                    continue
                updates = []
                for m in msgs:
                    try:
                        self.trust.check(m)
                    except UntrustedRecord as e:
                        log.error("model update refused: %s", e,
                                  extra={"partition": m.partition(), "offset": m.offset()})
                        self._dead_letter(m, e)
                        continue
                    try:
                        updates.append(decode_record(events_pb2.ModelUpdate, m.value(), m.headers()))
                    except UndecodableEvent as e:
                        # Logged, not dead-lettered: every pod reads every order (and re-reads them on
                        # restart), so each pod would add its own copy of the same dead letter.
                        log.error("undecodable model update skipped: %s", e,
                                  extra={"partition": m.partition(), "offset": m.offset()})
                self.manager.apply(updates)
        finally:
            consumer.close()

    def _dead_letter(self, msg: Any, err: UntrustedRecord) -> None:
        if self.dead is None:
            return
        try:
            self.dead.publish(msg, stage="inference.hotswap", reason=str(err), error_type=type(err).__name__)
        except Exception:  # noqa: BLE001 - the refusal stands; a lost dead letter must not stop following
            log.exception("dead-lettering a refused model update failed")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


class Heartbeater:
    """PodHeartbeat --> Weights.Heartbeat every `interval`; the ack's desired orders repair missed ones."""

    def __init__(self, settings: InferenceSettings, manager: VersionManager) -> None:
        self.settings = settings
        self.manager = manager
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._last_target: RoutingTable | None = None
        self._last_ack_at = 0.0
        self._failing_since: float | None = None

    def start(self) -> Heartbeater:
        self._thread.start()
        return self

    def _run(self) -> None:
        channel = open_channel(self.settings.weights_endpoint, self.settings.common)
        stub = weights_pb2_grpc.WeightsStub(channel)
        try:
            while not self._stop.is_set():
                self.beat(stub)
                self._stop.wait(self.settings.heartbeat_interval_s)
        finally:
            channel.close()

    def beat(self, stub: Any) -> None:
        try:
            ack = stub.Heartbeat(self.manager.heartbeat(), timeout=max(1.0, self.settings.heartbeat_interval_s))
        except grpc.RpcError as e:
            metrics.HEARTBEAT_FAILURES.inc()
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
                log.warning("heartbeat to %s failed: %s", self.settings.weights_endpoint, e.code().name)
            return
        if self._failing_since is not None:
            log.info("heartbeat reaches the weights service again")
            self._failing_since = None
        self.sent += 1
        self._catch_up(ack)

    def _catch_up(self, ack: weights_pb2.HeartbeatAck) -> None:
        previous, previous_at = self._last_target, self._last_ack_at
        self._last_ack_at = time.monotonic()
        mine = [u for u in ack.desired if u.model == self.manager.model]
        if not mine:
            self._last_target = None
            return
        target = RoutingTable({OPERATOR: Slot(promoted=BASE_VERSION)})
        for u in mine:
            try:
                target = target.apply(u)
            except InvalidOrder:
                return
        self._last_target = target
        stable = (previous is not None and _same(previous, target) and self.manager.applied_at < previous_at
                  and not self.manager.applying)  # an order being downloaded/loaded now is not a missed one
        if stable and not _same(self.manager.table, target):
            log.warning("pod missed model updates; converging on the weights service's desired state")
            self.manager.converge(target)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def _same(a: RoutingTable, b: RoutingTable) -> bool:
    def view(t: RoutingTable) -> dict[str, tuple[str, str, float]]:
        return {k: (s.promoted, s.canary, round(s.canary_fraction, 6)) for k, s in t.slots.items()}
    return view(a) == view(b)


def prune_versions_dir(root: Path, keep: set[str]) -> None:
    """Remove downloaded versions that are no longer served (a restarted pod re-fetches what it needs)."""
    if root.exists():
        for d in root.iterdir():
            if d.is_dir() and d.name not in keep:
                shutil.rmtree(d, ignore_errors=True)
