"""Generation requests --> vLLM's AsyncLLM (GPU), with LoRA versions and in-place full-weight swaps.

vLLM does the batching (continuous batching, paged KV cache) itself; this adapter runs its asyncio API
on a private event loop thread and translates results into `RequestHandle` events. Imported lazily
(`pip install 'apprentice[gpu]'`); nothing here runs on a machine without vLLM.

Versions:
- LoRA versions are vLLM LoRA adapters (`LoRARequest` per request), any number up to the GPU slots:
  canaries and tenant versions cost no reload of the base.
- One set of full weights at a time (`max_full_versions = 1`). A full version swaps in place between
  requests: new requests wait at a gate, in-flight ones finish on the old weights, the worker extension
  (`vllm_worker.WeightReloader`) loads the new tensors, the prefix cache is reset, the gate reopens.
  Requests that were routed to the old weights but had not started are re-routed by the server.

Log-probs (events.proto fields 14/15; the same meaning as the transformers engine):
- `logprobs_t1`: vLLM's default `logprobs_mode="raw_logprobs"` returns log softmax of the raw logits,
  i.e. temperature 1, unfiltered: exact.
- `logprobs` (behaviour): computed by `behaviour_logprob` from the top-K raw log-probs vLLM returns per
  token (K = `vllm_logprobs_topk`). Exact for greedy, for T = 1 without top-k/top-p, and for any T with
  top-k <= K and no top-p (the filtered support is inside the top K, and renormalising is invariant to
  the constant that separates raw log-probs from logits). Otherwise (top-p, or T != 1 without top-k)
  the normaliser is taken over the top K tokens only: an approximation whose error is the behaviour
  mass outside the top K (negligible for T <= 1 and K = 20 on instruction models).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from services.inference.config import InferenceSettings
from services.inference.engines.base import (
    BASE_VERSION,
    Engine,
    EngineStopped,
    GenerationRequest,
    RequestHandle,
    UnknownVersion,
    VersionFiles,
)
from shared.generation import Sample

log = logging.getLogger(__name__)


def behaviour_logprob(token: int, raw: Mapping[int, float], temperature: float, top_k: int, top_p: float) -> float:
    """log p_behaviour(token) from raw (T = 1) log-probs of a candidate set that contains `token`.

    p_behaviour = softmax(filter_top_k_top_p(logits / T)) restricted to `raw`'s tokens:
    1) scale: s_i = raw_i / T (raw_i = logit_i - logZ, and softmax ignores the shared constant);
    2) keep the top_k largest (if top_k > 0);
    3) keep the smallest prefix, by decreasing probability, whose mass reaches top_p (if top_p < 1);
    4) renormalise over what is kept. Greedy (T = 0) is a point mass: 0.0.
    """
    if temperature <= 0:
        return 0.0
    if token not in raw:
        raise KeyError(f"token {token} missing from the candidate log-probs")
    ranked = sorted(raw.items(), key=lambda kv: kv[1], reverse=True)
    scaled = [(t, lp / temperature) for t, lp in ranked]
    if top_k > 0:
        scaled = scaled[:top_k]
    m = scaled[0][1]
    log_z = m + math.log(sum(math.exp(s - m) for _, s in scaled))
    if 0 < top_p < 1:
        kept, mass = [], 0.0
        for t, s in scaled:
            if mass >= top_p:
                break
            kept.append((t, s))
            mass += math.exp(s - log_z)
        scaled = kept
        log_z = m + math.log(sum(math.exp(s - m) for _, s in scaled))
    for t, s in scaled:
        if t == token:
            return s - log_z
    return float("-inf")  # the token was outside the (approximate) filtered support


class VLLMEngine(Engine):
    name = "vllm"
    max_full_versions = 1

    def __init__(self, settings: InferenceSettings) -> None:
        self.settings = settings
        self.model_name = settings.common.model
        self._tok: Any = None
        self._ctx = 0
        self._engine: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._full = BASE_VERSION                  # label of the full weights on the GPU
        self._full_path = ""
        self._loras: dict[str, Any] = {}           # version -> LoRARequest
        self._next_lora_id = 1
        self._inflight: dict[str, int] = {}        # version -> running requests
        self._gate = threading.Event()
        self._gate.set()
        self._stopping = False
        self._lock = threading.Lock()

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise RuntimeError("the vllm engine needs vLLM on a CUDA machine: pip install 'apprentice[gpu]'") from e
        from shared.models import load_tokenizer, resolve_model_dir

        path = str(resolve_model_dir(self.model_name))
        self._full_path = path
        self._tok = load_tokenizer(self.model_name)
        s = self.settings
        optional: dict[str, Any] = {}                      # only when set: older vLLMs lack the argument
        if s.vllm_attention_backend:
            optional["attention_backend"] = s.vllm_attention_backend
        args = AsyncEngineArgs(
            model=path, tokenizer=path, enable_lora=True, max_loras=s.vllm_max_loras,
            max_lora_rank=s.vllm_max_lora_rank, gpu_memory_utilization=s.vllm_gpu_memory_utilization,
            max_model_len=s.context_window or None, max_logprobs=max(20, s.vllm_logprobs_topk),
            worker_extension_cls="services.inference.engines.vllm_worker.WeightReloader",
            dtype="auto" if s.dtype == "float32" else s.dtype, enforce_eager=s.vllm_enforce_eager, **optional)
        self._thread.start()

        async def make() -> Any:
            return AsyncLLM.from_engine_args(args)

        self._engine = self._run(make())
        self._ctx = int(self._engine.model_config.max_model_len)
        log.info("vllm engine ready", extra={"model": self.model_name, "context_window": self._ctx})

    def healthy(self) -> bool:
        return self._thread.is_alive() and (self._engine is None or not getattr(self._engine, "errored", False))

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def context_window(self) -> int:
        return self._ctx

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(self._inflight.values()):
            time.sleep(0.05)
        if self._engine is not None:
            self._engine.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)

    # --- requests ---------------------------------------------------------------------------------
    def loaded_versions(self) -> list[str]:
        with self._lock:
            return sorted({self._full, *self._loras})

    def submit(self, request: GenerationRequest) -> RequestHandle:
        if self._stopping:
            raise EngineStopped("the engine is shutting down")
        if request.version not in self.loaded_versions():
            raise UnknownVersion(request.version)
        handle = RequestHandle(request)
        asyncio.run_coroutine_threadsafe(self._generate(handle), self._loop)
        return handle

    async def _generate(self, handle: RequestHandle) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        req = handle.request
        while not self._gate.is_set():                      # a full-weight swap is in progress
            await asyncio.sleep(0.01)
        with self._lock:
            lora = self._loras.get(req.version)
            if req.version != self._full and lora is None:
                handle.fail(UnknownVersion(req.version))    # swapped out while waiting: the server re-routes
                return
            self._inflight[req.version] = self._inflight.get(req.version, 0) + 1
        cfg = req.sampling
        k = self.settings.vllm_logprobs_topk
        params = SamplingParams(n=max(1, cfg.n), temperature=cfg.temperature, top_p=cfg.top_p,
                                top_k=cfg.top_k if cfg.top_k > 0 else -1, max_tokens=cfg.max_new_tokens,
                                stop=list(cfg.stop) or None, seed=cfg.seed, logprobs=k,
                                output_kind=RequestOutputKind.DELTA, skip_special_tokens=True)
        samples = {i: Sample() for i in range(max(1, cfg.n))}
        raw_sets: dict[int, list[Mapping[int, float]]] = {i: [] for i in samples}
        handle.started_at = time.monotonic()
        watcher = asyncio.ensure_future(self._watch_cancel(handle))
        try:
            async for out in self._engine.generate(TokensPrompt(prompt_token_ids=req.prompt_ids), params,
                                                   req.request_id, lora_request=lora):
                for c in out.outputs:
                    s = samples[c.index]
                    new_ids = list(c.token_ids)
                    s.token_ids.extend(new_ids)
                    s.text += c.text
                    for tid, lps in zip(new_ids, c.logprobs or [], strict=False):
                        raw = {int(t): float(lp.logprob) for t, lp in lps.items()}
                        s.logprobs_t1.append(raw[tid])
                        raw_sets[c.index].append(raw)
                    if req.stream and (new_ids or c.text):
                        handle.push_delta(c.index, new_ids, c.text)
                    if c.finish_reason is not None:
                        s.finish_reason = "cancelled" if c.finish_reason == "abort" else c.finish_reason
                        s.logprobs = [behaviour_logprob(t, raw, cfg.temperature, cfg.top_k, cfg.top_p)
                                      for t, raw in zip(s.token_ids, raw_sets[c.index], strict=True)]
                        handle.push_choice(c.index, s)
            for i, s in samples.items():                    # aborted before any output
                if not handle.has_choice(i):
                    s.finish_reason = "cancelled"
                    s.logprobs = [0.0] * len(s.token_ids)
                    handle.push_choice(i, s)
        except Exception as e:  # noqa: BLE001 - surfaced to the caller as INTERNAL
            handle.fail(e)
        finally:
            watcher.cancel()
            with self._lock:
                self._inflight[req.version] -= 1

    async def _watch_cancel(self, handle: RequestHandle) -> None:
        while not handle.done:
            if handle.cancelled():
                await self._engine.abort(handle.request.request_id)
                return
            await asyncio.sleep(0.05)

    # --- versions ---------------------------------------------------------------------------------
    def load_version(self, files: VersionFiles) -> None:
        if files.version in self.loaded_versions():
            return
        if files.kind == "lora":
            self._load_lora(files)
        elif files.kind in ("full", ""):
            self._swap_full(files)
        else:
            raise ValueError(f"version {files.version}: unknown kind {files.kind!r} (full | lora)")

    def _load_lora(self, files: VersionFiles) -> None:
        from vllm.lora.request import LoRARequest

        if (files.base_version or BASE_VERSION) != self._full:
            raise ValueError(f"LoRA {files.version} applies to {files.base_version!r}; the GPU holds {self._full!r}")
        lr = LoRARequest(lora_name=files.version, lora_int_id=self._next_lora_id, lora_path=str(files.path))
        self._next_lora_id += 1
        self._run(self._engine.add_lora(lr), timeout=300)
        with self._lock:
            self._loras[files.version] = lr

    def _swap_full(self, files: VersionFiles) -> None:
        self._gate.clear()
        try:
            deadline = time.monotonic() + max(self.settings.grace_s, 30.0)
            while any(self._inflight.values()) and time.monotonic() < deadline:
                time.sleep(0.02)                           # in-flight requests finish on the old weights
            try:
                self._run(self._engine.collective_rpc("apprentice_load_weights", args=(str(files.path),)),
                          timeout=600)
            except Exception:
                log.exception("full-weight swap failed; restoring %s", self._full)
                self._run(self._engine.collective_rpc("apprentice_load_weights", args=(self._full_path,)),
                          timeout=600)
                raise
            self._run(self._engine.reset_prefix_cache(), timeout=60)
            with self._lock:
                stale = list(self._loras.values())
                self._loras.clear()
                self._full, self._full_path = files.version, str(files.path)
            for lr in stale:                               # adapters of the old weights no longer apply
                self._run(self._engine.remove_lora(lr.lora_int_id), timeout=60)
        finally:
            self._gate.set()

    def unload_version(self, version: str) -> None:
        with self._lock:
            lr = self._loras.pop(version, None)
        if lr is None:
            return

        def remove_when_idle() -> None:
            deadline = time.monotonic() + 600
            while self._inflight.get(version, 0) and time.monotonic() < deadline:
                time.sleep(0.1)
            self._run(self._engine.remove_lora(lr.lora_int_id), timeout=60)

        threading.Thread(target=remove_when_idle, name=f"vllm-unload-{version}", daemon=True).start()
