"""Queued requests --> batches on one scheduler thread --> `DecodeBatch` steps (CPU default engine).

Two schedulers (`APPRENTICE_INFERENCE_SCHEDULER`):
- `continuous` (default, engines/continuous.py): requests join a running batch at the next decode step
  and finished rows leave at once, within a rows x tokens budget, tenants taking turns;
- `static`: the scheduler takes the oldest queued request, waits `batch_wait_ms` for others routed to
  the same version, and decodes them together to the end (kept for comparison).
A forward pass runs exactly one version, so a hot swap happens *between* steps by construction:
- full versions are loaded by the caller's thread (off the serving path) into a new model object and
  published atomically; a request keeps the version object it was submitted to, so requests queued
  before a swap finish on, and are attributed to, the old version;
- LoRA adapters attach to the already-loaded base (peft, one named adapter per version, no reload of
  the base); attaching changes the base's modules, so it runs on the scheduler thread between steps,
  and every step activates its batch's adapter (or disables adapters for the base version).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from services.inference import metrics
from services.inference.config import InferenceSettings
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

log = logging.getLogger(__name__)


@dataclass
class Backbone:
    """One set of full weights in memory, plus the LoRA adapters attached to it (if any)."""

    version: str
    model: Any
    peft: Any = None                      # PeftModel wrapping `model` once an adapter is attached
    adapters: set[str] = field(default_factory=set)


@dataclass
class Policy:
    """A servable version: a backbone, optionally with one of its adapters active."""

    version: str
    backbone: Backbone
    adapter: str | None = None

    @contextlib.contextmanager
    def activate(self) -> Iterator[Any]:
        """Yield the module to run forward passes with, with exactly this version's adapter active."""
        bb = self.backbone
        if self.adapter is not None:
            bb.peft.set_adapter(self.adapter)
            yield bb.peft
        elif bb.peft is not None:
            with bb.peft.disable_adapter():
                yield bb.model
        else:
            yield bb.model


def _push_delta(handle: RequestHandle, index: int, token_ids: list[int], text: str) -> None:
    handle.push_delta(index, token_ids, text)


def _push_choice(handle: RequestHandle, index: int, sample: Any) -> None:
    handle.push_choice(index, sample)


@dataclass
class _Queued:
    handle: RequestHandle
    policy: Policy


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
        self._queue: deque[_Queued] = deque()
        self._tasks: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._stopping = False
        self._running: list[_Queued] = []            # taken from the queue, not finished (both schedulers)
        self._peaks: deque[tuple[float, int]] = deque()   # (time, requests queued + running) at submits
        self._thread: threading.Thread | None = None
        self._scheduler: Any = None                   # the ContinuousScheduler, when that one runs

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        import torch

        from services.inference.decoding import eos_ids_of
        from shared.models import load_model

        if self.settings.common.torch_threads > 0:
            torch.set_num_threads(self.settings.common.torch_threads)
        model, tok = load_model(self.model_name, dtype=getattr(torch, self.settings.dtype),
                                device=self.settings.device)
        self._tok = tok
        self._eos = eos_ids_of(model, tok)
        self._ctx = self.settings.context_window or int(getattr(model.config, "max_position_embeddings", 2048))
        with self._lock:
            self._policies[BASE_VERSION] = Policy(BASE_VERSION, Backbone(BASE_VERSION, model))
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()
        log.info("transformers engine ready", extra={"model": self.model_name, "context_window": self._ctx})

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
            self._queue.append(_Queued(handle, policy))
            self._peaks.append((time.monotonic(), len(self._queue) + len(self._running)))
            metrics.QUEUE_DEPTH.set(len(self._queue))
            self._cv.notify_all()
        return handle

    def _take_batch(self) -> list[_Queued] | None:
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
                from services.inference.engines.continuous import ContinuousScheduler

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

    def _run_batch(self, batch: list[_Queued]) -> None:
        from services.inference.decoding import DecodeRow, decode_batch

        policy = batch[0].policy
        rows: list[DecodeRow] = []
        now = time.monotonic()
        for q in batch:
            h, req = q.handle, q.handle.request
            h.started_at = now
            metrics.QUEUE_SECONDS.observe(now - h.submitted_at)
            for i in range(max(1, req.sampling.n)):
                rows.append(DecodeRow(
                    prompt_ids=req.prompt_ids, params=req.sampling, sample_index=i, stream=req.stream,
                    on_delta=functools.partial(_push_delta, h, i), on_finish=functools.partial(_push_choice, h, i),
                    cancelled=h.cancelled))
        t0 = time.perf_counter()
        try:
            with policy.activate() as forward:
                stats = decode_batch(policy.backbone.model, self._tok, rows, eos_ids=self._eos,
                                     context_window=self._ctx, forward=forward)
        except Exception as e:  # noqa: BLE001 - one broken batch must not stop the engine
            log.exception("batch failed", extra={"version": policy.version, "rows": len(rows)})
            for q in batch:
                q.handle.fail(EngineError(f"generation failed: {type(e).__name__}: {e}"))
            return
        dt = time.perf_counter() - t0
        metrics.BATCH_ROWS.observe(len(rows))
        metrics.BATCH_REQUESTS.observe(len(batch))
        metrics.GENERATED_TOKENS.labels(version=policy.version).inc(stats.tokens)
        if dt > 0:
            metrics.TOKENS_PER_SECOND.set(stats.tokens / dt)

    # --- between-batch tasks (LoRA attach/detach) --------------------------------------------------
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
        import torch
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(files.path, dtype=getattr(torch, self.settings.dtype))
        model.to(self.settings.device)
        model.eval()
        vocab = int(model.get_input_embeddings().weight.shape[0])
        if vocab < len(self._tok):
            raise ValueError(f"version {files.version}: vocabulary {vocab} < tokenizer {len(self._tok)}")
        with self._lock:
            self._policies[files.version] = Policy(files.version, Backbone(files.version, model))

    def _load_lora(self, files: VersionFiles) -> None:
        import json

        base_v = files.base_version or BASE_VERSION
        with self._lock:
            base = self._policies.get(base_v)
        if base is None or base.adapter is not None:
            raise ValueError(f"LoRA version {files.version} applies to {base_v!r}, which is not loaded as "
                             "full weights here")
        cfg = json.loads((files.path / "adapter_config.json").read_text())   # fail early, off the path
        if cfg.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"version {files.version}: adapter type {cfg.get('peft_type')!r} is not LoRA")
        bb = base.backbone
        from peft import PeftModel  # imported here, off the scheduler: the first import takes seconds

        def attach() -> None:

            if bb.peft is None:
                bb.peft = PeftModel.from_pretrained(bb.model, files.path, adapter_name=files.version,
                                                    is_trainable=False)
                bb.peft.eval()
            else:
                bb.peft.load_adapter(files.path, adapter_name=files.version, is_trainable=False)
            bb.adapters.add(files.version)

        self._between_batches(attach)
        with self._lock:
            self._policies[files.version] = Policy(files.version, bb, adapter=files.version)

    def unload_version(self, version: str) -> None:
        if version == BASE_VERSION:
            return
        with self._lock:
            policy = self._policies.pop(version, None)
        if policy is None or policy.adapter is None:
            return  # full weights are freed when the last queued request on them finishes

        def still_queued() -> bool:
            with self._cv:
                return any(q.policy is policy for q in list(self._queue) + list(self._running))

        def detach() -> None:
            bb = policy.backbone
            if still_queued():
                threading.Timer(1.0, lambda: self._tasks_append(detach)).start()
                return
            if bb.peft is None or version not in bb.adapters:
                return
            if bb.adapters == {version}:
                bb.model = bb.peft.unload()      # last adapter: restore the plain base modules
                bb.peft = None
            else:
                bb.peft.delete_adapter(version)
            bb.adapters.discard(version)

        self._tasks_append(detach)

    def _tasks_append(self, fn: Callable[[], Any]) -> None:
        with self._cv:
            self._tasks.append((fn, Future()))
            self._cv.notify_all()
