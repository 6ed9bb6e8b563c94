"""Queued requests --> batches on one scheduler thread --> `DecodeBatch` steps (CPU default engine).

Two schedulers (`APPRENTICE_INFERENCE_SCHEDULER`):
- `continuous` (default, engines/continuous.py): requests join a running batch at the next decode step
  and finished rows leave at once, within a rows x tokens budget, tenants taking turns;
- `static`: the scheduler takes the oldest queued request, waits `batch_wait_ms` for others routed to
  the same version, and decodes them together to the end (kept for comparison).
A forward pass runs exactly one set of full weights, so a hot swap happens *between* steps by construction:
- full versions are loaded by the caller's thread (off the serving path) into a new model object and
  published atomically; a request keeps the version object it was submitted to, so requests queued
  before a swap finish on, and are attributed to, the old version;
- LoRA versions are adapters of an already-loaded base, one per version (typically one per tenant), and
  rows of different adapters share a batch: each row carries its adapter's slot in the base's
  `LoraPool` (services/inference/multi_lora.py), and every layer an adapter targets adds that row's
  low-rank term. Loading a LoRA version checks its files and registers it; its weights are made
  resident on demand, in the background, and evicted least recently used under a memory budget
  (services/inference/adapter_cache.py), so the first request of a cold adapter waits alone.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from services.inference import metrics
from services.inference.adapter_cache import AdapterCache
from services.inference.engines.base import (
    BASE_VERSION,
    Engine,
    EngineError,
    EngineStopped,
    GenerationRequest,
    RequestHandle,
    UnknownVersion,
    VersionFiles,
)
from services.inference.engines.continuous import ContinuousScheduler
from services.inference.engines.transformers_types import Backbone, Policy, Queued
from services.inference.multi_lora import LoraPool
from services.inference.settings import InferenceSettings
from shared.decoding.batch import decode_batch
from shared.decoding.rows import DecodeRow
from shared.decoding.text import eos_ids_of
from shared.models import load_model

log = logging.getLogger(__name__)


def _push_delta(handle: RequestHandle, index: int, token_ids: list[int], text: str) -> None:
    handle.push_delta(index, token_ids, text)


def _push_choice(handle: RequestHandle, index: int, sample: Any) -> None:
    handle.push_choice(index, sample)


class TransformersEngine(Engine):
    name = "transformers"

    def __init__(self, settings: InferenceSettings) -> None:
        self.settings = settings
        self.model_name = settings.common.model
        self._tok: Any = None
        self._ctx = 0
        self._eos: set[int] = set()
        self._policies: dict[str, Policy] = {}
        self._lock = threading.Lock()                 # guards _policies
        self._cv = threading.Condition()              # guards _queue, _tasks, _stopping
        self._queue: deque[Queued] = deque()
        self._tasks: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._stopping = False
        self._running: list[Queued] = []            # taken from the queue, not finished (both schedulers)
        self._peaks: deque[tuple[float, int]] = deque()   # (time, requests queued + running) at submits
        self._thread: threading.Thread | None = None
        self._scheduler: ContinuousScheduler | None = None   # when that scheduler runs
        s = settings
        self.adapters = AdapterCache(max_count=s.adapter_cache_max_count, max_bytes=s.adapter_cache_max_bytes,
                                     max_rank=s.adapter_max_rank, workers=s.adapter_load_workers, wake=self._wake)

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self.settings.common.torch_threads > 0:
            torch.set_num_threads(self.settings.common.torch_threads)
        model, tok = load_model(self.model_name, dtype=getattr(torch, self.settings.dtype),
                                device=self.settings.torch_device)
        self._tok = tok
        self._eos = eos_ids_of(model, tok)
        self._ctx = self.settings.context_window or int(getattr(model.config, "max_position_embeddings", 2048))
        with self._lock:
            self._policies[BASE_VERSION] = Policy(BASE_VERSION, Backbone(BASE_VERSION, model))
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()
        log.info("transformers engine ready", extra={"model": self.model_name, "context_window": self._ctx})

    def _wake(self) -> None:
        """A background adapter load finished: the scheduler may be waiting for it."""
        with self._cv:
            self._cv.notify_all()

    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def context_window(self) -> int:
        return self._ctx

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self._queue or self._running):
            time.sleep(0.02)
        with self._cv:
            left = list(self._queue) + list(self._running)
        for q in left:
            q.handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, deadline - time.monotonic() + 2.0))
        self.adapters.close()

    # --- requests ---------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        with self._lock:
            policy = self._policies.get(request.version)
        if policy is None:
            raise UnknownVersion(request.version)
        handle = RequestHandle(request)
        with self._cv:
            if self._stopping:
                raise EngineStopped("the engine is shutting down")
            if policy.adapter is not None:          # keeps a retired adapter until its last request ends
                adapter = policy.adapter
                self.adapters.ref(adapter)
                handle.add_done_callback(lambda _h: self.adapters.unref(adapter))
            self._queue.append(Queued(handle, policy))
            self._peaks.append((time.monotonic(), len(self._queue) + len(self._running)))
            metrics.QUEUE_DEPTH.set(len(self._queue))
            self._cv.notify_all()
        return handle

    def _take_batch(self) -> list[Queued] | None:
        """The oldest request plus same-version requests that arrive within `batch_wait_ms`."""
        wait_s = self.settings.batch_wait_ms / 1000.0
        max_rows = self.settings.max_batch_rows
        with self._cv:
            while not self._queue and not self._tasks and not self._stopping:
                self._cv.wait(0.5)
            if not self._queue:
                return None
            first = self._queue.popleft()
            batch, rows = [first], max(1, first.handle.request.sampling.n)
            now = time.monotonic()
            until = now + wait_s
            refill_until = now + self.settings.batch_refill_ms / 1000.0
            while rows < max_rows:
                picked = None
                for q in self._queue:
                    if q.policy is first.policy:
                        picked = q
                        break
                if picked is not None:
                    n = max(1, picked.handle.request.sampling.n)
                    if rows + n > max_rows:
                        break
                    self._queue.remove(picked)
                    batch.append(picked)
                    rows += n
                    continue
                # Steady concurrency: the clients of the last batch resubmit within milliseconds of each
                # other; wait (bounded) until the batch holds as many requests as were recently in the
                # system at once, so batches do not fragment into alternating halves.
                deadline = refill_until if len(batch) < self._recent_concurrency(now) else until
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            metrics.QUEUE_DEPTH.set(len(self._queue))
            self._running = batch
            return batch

    def _recent_concurrency(self, now: float) -> int:
        """Most requests queued + running at once during the last two seconds (caller holds _cv)."""
        while self._peaks and now - self._peaks[0][0] > 2.0:
            self._peaks.popleft()
        return max((c for _, c in self._peaks), default=1)

    def healthy(self) -> bool:
        return self._thread is not None and (self._thread.is_alive() or self._stopping)

    def _loop(self) -> None:
        try:
            if self.settings.scheduler == "continuous":
                self._scheduler = ContinuousScheduler(self)
                self._scheduler.run()
            else:
                self._schedule()
        except BaseException:
            log.critical("engine scheduler died; the pod reports NOT_SERVING", exc_info=True)
            with self._cv:
                left = list(self._queue) + list(self._running)
                self._queue.clear()
            for q in left:
                q.handle.fail(EngineError("the engine stopped"))
            raise

    def _schedule(self) -> None:
        while True:
            self._run_tasks()
            self.adapters.commit()
            batch = self._take_batch()
            if batch is None:
                with self._cv:
                    if self._stopping and not self._queue:
                        break
                continue
            try:
                self._run_batch(batch)
            finally:
                with self._cv:
                    self._running = []
        self._run_tasks()

    def _run_batch(self, batch: list[Queued]) -> None:
        policy = batch[0].policy
        bb = policy.backbone
        rows: list[DecodeRow] = []
        slot = 0
        if policy.adapter is not None:
            try:
                slot = self.adapters.load_now(policy.adapter)
            except Exception as e:  # noqa: BLE001 - an adapter that cannot load fails its requests only
                for q in batch:
                    q.handle.fail(EngineError(f"adapter {policy.adapter} could not be loaded: {e}"))
                return
        now = time.monotonic()
        for q in batch:
            h, req = q.handle, q.handle.request
            h.started_at = now
            metrics.QUEUE_SECONDS.observe(now - h.submitted_at)
            for i in range(max(1, req.sampling.n)):
                rows.append(DecodeRow(
                    prompt_ids=req.prompt_ids, params=req.sampling, sample_index=i, stream=req.stream,
                    on_delta=functools.partial(_push_delta, h, i), on_finish=functools.partial(_push_choice, h, i),
                    cancelled=h.cancelled, adapter=slot))
        t0 = time.perf_counter()
        try:
            stats = decode_batch(bb.model, self._tok, rows, eos_ids=self._eos, context_window=self._ctx,
                                 router=bb.lora)
        except Exception as e:  # noqa: BLE001 - one broken batch must not stop the engine
            log.exception("batch failed", extra={"version": policy.version, "rows": len(rows)})
            for q in batch:
                q.handle.fail(EngineError(f"generation failed: {type(e).__name__}: {e}"))
            return
        finally:
            if policy.adapter is not None:
                self.adapters.release(policy.adapter)
        dt = time.perf_counter() - t0
        metrics.BATCH_ROWS.observe(len(rows))
        metrics.BATCH_REQUESTS.observe(len(batch))
        metrics.GENERATED_TOKENS.labels(version=policy.version).inc(stats.tokens)
        if dt > 0:
            metrics.TOKENS_PER_SECOND.set(stats.tokens / dt)

    # --- between-batch tasks ----------------------------------------------------------------------
    def _between_batches(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the scheduler thread when no batch is running; wait for its result."""
        if self._thread is None or not self._thread.is_alive():
            return fn()  # not serving: nothing to race with
        fut: Future[Any] = Future()
        with self._cv:
            self._tasks.append((fn, fut))
            self._cv.notify_all()
        return fut.result()

    def _run_tasks(self) -> None:
        while True:
            with self._cv:
                if not self._tasks:
                    return
                fn, fut = self._tasks.popleft()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                fut.set_exception(e)

    # --- versions ---------------------------------------------------------------------------------
    def loaded_versions(self) -> list[str]:
        with self._lock:
            return sorted(self._policies)

    def load_version(self, files: VersionFiles) -> None:
        with self._lock:
            if files.version in self._policies:
                return
        if files.kind == "lora":
            self._load_lora(files)
        elif files.kind in ("full", ""):
            self._load_full(files)
        else:
            raise ValueError(f"version {files.version}: unknown kind {files.kind!r} (full | lora)")
        log.info("version loaded", extra={"version": files.version, "kind": files.kind})

    def _load_full(self, files: VersionFiles) -> None:
        # heavy: transformers, only when a full model version is swapped in
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(files.path, dtype=getattr(torch, self.settings.dtype),
                                                          use_safetensors=True)  # never a pickle: shared/weights/formats.py
        model.to(self.settings.torch_device)
        model.eval()
        vocab = int(model.get_input_embeddings().weight.shape[0])
        if vocab < len(self._tok):
            raise ValueError(f"version {files.version}: vocabulary {vocab} < tokenizer {len(self._tok)}")
        with self._lock:
            self._policies[files.version] = Policy(files.version, Backbone(files.version, model))

    def _load_lora(self, files: VersionFiles) -> None:
        base_v = files.base_version or BASE_VERSION
        with self._lock:
            base = self._policies.get(base_v)
        if base is None or base.adapter is not None:
            raise ValueError(f"LoRA version {files.version} applies to {base_v!r}, which is not loaded as "
                             "full weights here")
        bb = base.backbone
        if bb.lora is None:
            # no hooks until an adapter is resident: nothing changes yet
            bb.lora = LoraPool(bb.model, max_slots=self.settings.adapter_cache_max_count)
        self.adapters.register(files.version, files.path, bb.lora)   # reads and checks the files, here
        with self._lock:
            bb.adapters.add(files.version)
            self._policies[files.version] = Policy(files.version, bb, adapter=files.version)

    def unload_version(self, version: str) -> None:
        if version == BASE_VERSION:
            return
        with self._lock:
            policy = self._policies.pop(version, None)
            if policy is not None and policy.adapter is not None:
                policy.backbone.adapters.discard(version)
        if policy is not None and policy.adapter is not None:
            self.adapters.retire(version)    # freed once no queued or running request refers to it
        # full weights are freed when the last queued request on them finishes
