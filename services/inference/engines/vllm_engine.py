"""Generation requests --> vLLM's AsyncLLM (GPU, or CPU with the vllm-cpu build), with LoRA versions
and in-place full-weight swaps.

vLLM does the batching (continuous batching, paged KV cache) itself, in its engine-core process; this
adapter runs its asyncio API on a private event loop thread and translates results into `RequestHandle`
events. Imported lazily: `pip install 'apprentice[gpu]'` on a CUDA machine, `make setup-vllm` for the
CPU build in `.venv-vllm`. Written for vLLM 0.32 (`check_vllm_version`: other releases moved the APIs
used here before, and fail with a message instead of a wrong answer).

Versions:
- LoRA versions are vLLM LoRA adapters (`LoRARequest` per request), up to `engine.max_loras` at once:
  canaries and tenant versions cost no reload of the base.
- One set of full weights at a time (`max_full_versions = 1`). A full version swaps in place between
  requests: `submit` holds new requests at a gate, in-flight ones finish on the old weights, the worker
  extension (`vllm_worker.WeightReloader`) loads the new tensors, the prefix cache is reset, the gate
  reopens. A request routed to a label that the swap retired is refused with `UnknownVersion` (the server
  routes it again), but only `HANDOVER_S` after the swap: the routing table that names the new version
  is published right after `load_version` returns, and an immediate refusal would be routed to the old
  label again and fail.

Log-probs (events.proto fields 14/15; the same meaning as the transformers engine):
- `logprobs_t1`: vLLM's default `logprobs_mode="raw_logprobs"` returns log softmax of the raw logits,
  i.e. temperature 1, unfiltered: exact.
- `logprobs` (behaviour): computed by `behaviour_logprob` (shared/decoding/logprobs.py) from the top-K raw log-probs vLLM returns per
  token (K = `engine.logprobs_topk`). Exact for greedy, for T = 1 without top-k/top-p, and for any T with
  top-k <= K and no top-p (the filtered support is inside the top K, and renormalising is invariant to
  the constant that separates raw log-probs from logits). Otherwise (top-p, or T != 1 without top-k)
  the normaliser is taken over the top K tokens only: an approximation whose error is the behaviour
  mass outside the top K (negligible for T <= 1 and K = 20 on instruction models).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

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
from services.inference.settings import InferenceSettings
from shared.decoding.logprobs import alternatives_from_raw, behaviour_logprob
from shared.decoding.params import Grammar, Sample
from shared.models import load_tokenizer, resolve_model_dir
from shared.weights.formats import require_safetensors

log = logging.getLogger(__name__)

SUPPORTED_VLLM = (0, 32)
"""The vLLM release (major, minor) this adapter is written and tested for (`make test-vllm`)."""
HANDOVER_S = 1.0
"""After a full swap, how long a request routed to a retired label waits before it is refused (see above)."""
CPU_KV_CACHE_GIB = 1
"""KV cache of the CPU backend when `VLLM_CPU_KVCACHE_SPACE` (GiB) is not set: vLLM's own default
reserves a fraction of the machine's memory, which a shared host does not have."""
INSTALL_HINT = ("on a CUDA machine: pip install 'apprentice[gpu]' (vllm==0.32.0); on a CPU: `make setup-vllm` "
                "and run with .venv-vllm/bin/python")


def structured_outputs_kwargs(grammar: Grammar | None) -> dict[str, Any] | None:
    """`SamplingConfig.grammar` as vLLM's StructuredOutputsParams keyword arguments (vLLM >= 0.12; the
    engine runs the guidance backend, so a Lark grammar may embed `%json{...}`). None: unconstrained."""
    if grammar is None:
        return None
    if grammar.kind == "json_schema":
        return {"json": grammar.source}
    if grammar.kind == "json_object":
        return {"json_object": True}
    if grammar.kind == "lark":
        return {"grammar": grammar.source}
    raise ValueError(f"unknown grammar kind {grammar.kind!r}")


def _structured(params_cls: Any, grammar: Grammar | None) -> Any:
    kwargs = structured_outputs_kwargs(grammar)
    return None if kwargs is None else params_cls(**kwargs)


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM release this adapter was not written for, naming what to install."""
    parts = version.split("+")[0].split(".")
    try:
        found = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise RuntimeError(f"cannot read the vLLM version {version!r}; the vllm engine needs vLLM "
                           f"{SUPPORTED_VLLM[0]}.{SUPPORTED_VLLM[1]}.x ({INSTALL_HINT})") from None
    if found != SUPPORTED_VLLM:
        raise RuntimeError(f"the vllm engine is written for vLLM {SUPPORTED_VLLM[0]}.{SUPPORTED_VLLM[1]}.x, "
                           f"found {version} ({INSTALL_HINT})")


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
        self._full = BASE_VERSION                  # label of the full weights the engine holds
        self._full_path = ""
        self._loras: dict[str, Any] = {}           # version -> LoRARequest
        self._next_lora_id = 1
        self._inflight: dict[str, int] = {}        # version -> admitted requests not finished
        self._retired: dict[str, float] = {}       # label -> when a swap or unload retired it
        self._gate = threading.Event()             # cleared while full weights are being swapped
        self._gate.set()
        self._stopping = False
        self._lock = threading.Lock()              # guards the fields above
        self._swap_lock = threading.Lock()         # one version change at a time
        self.on_cpu = False

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            # optional: vLLM (the gpu extra); this module imports without it
            import vllm
        except ImportError as e:
            raise RuntimeError(f"the vllm engine needs vLLM: {INSTALL_HINT}") from e
        check_vllm_version(str(vllm.__version__))
        # optional: vLLM, as above
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        path = str(resolve_model_dir(self.model_name))
        self._full_path = path
        self._tok = load_tokenizer(self.model_name)
        s = self.settings
        self.on_cpu = bool(current_platform.is_cpu())
        optional: dict[str, Any] = {}
        if s.vllm.attention_backend:
            optional["attention_backend"] = s.vllm.attention_backend
        if self.on_cpu:
            # The engine core reads these in its own (spawned) process. vLLM binds its OpenMP threads to
            # cores; a pod that was given a thread budget keeps to it.
            gib = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KV_CACHE_GIB)
            optional["kv_cache_memory_bytes"] = int(gib * (1 << 30))
            dtype = s.dtype                                   # fp32 on CPU: the same numbers as transformers
        else:
            optional["gpu_memory_utilization"] = s.vllm.gpu_memory_utilization
            dtype = "auto" if s.dtype == "float32" else s.dtype
        args = AsyncEngineArgs(
            model=path, tokenizer=path, enable_lora=True, max_loras=s.vllm.max_loras,
            max_lora_rank=s.vllm.max_lora_rank, max_model_len=s.context_window or None,
            max_logprobs=max(20, s.vllm.logprobs_topk),
            worker_extension_cls="services.inference.engines.vllm_worker.WeightReloader",
            dtype=dtype, enforce_eager=s.vllm.enforce_eager or self.on_cpu,
            # the same grammar engine as the transformers engine (shared/decoding/constraints.py): Lark with
            # embedded %json{...} (tool calls) is llguidance's dialect, which only vLLM's guidance backend reads;
            # JSON without free whitespace, as constraints.py compiles it (vLLM's default lets a weak model fill
            # its whole budget with blanks inside a valid object, which then never ends: the doors' contract)
            structured_outputs_config=StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True),
            **optional)
        self._thread.start()

        async def make() -> Any:
            return AsyncLLM.from_engine_args(args)

        self._engine = self._run(make())
        self._ctx = int(self._engine.model_config.max_model_len)
        log.info("vllm engine ready", extra={"model": self.model_name, "context_window": self._ctx,
                                              "vllm": str(vllm.__version__), "cpu": self.on_cpu})

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
        self._thread.join(timeout=5)

    # --- requests ---------------------------------------------------------------------------------
    def loaded_versions(self) -> list[str]:
        with self._lock:
            return sorted({self._full, *self._loras})

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Admit a request on the weights it was routed to; during a full swap, wait for its end."""
        version = request.version
        while True:
            if self._stopping:
                raise EngineStopped("the engine is shutting down")
            with self._lock:
                if self._gate.is_set():
                    lora = self._loras.get(version)
                    known = version == self._full or lora is not None
                    if known:
                        self._inflight[version] = self._inflight.get(version, 0) + 1
                    retired_at = self._retired.get(version)
                    break
            left = None if request.deadline is None else request.deadline - time.monotonic()
            if left is not None and left <= 0:
                raise UnknownVersion(version)
            self._gate.wait(timeout=0.5 if left is None else min(left, 0.5))
        if not known:
            if retired_at is not None:                  # let the new routing table be published first
                time.sleep(max(0.0, retired_at + HANDOVER_S - time.monotonic()))
            raise UnknownVersion(version)
        handle = RequestHandle(request)
        asyncio.run_coroutine_threadsafe(self._generate(handle, lora), self._loop)
        return handle

    async def _generate(self, handle: RequestHandle, lora: Any) -> None:
        req = handle.request
        cfg = req.sampling
        try:
            # optional: vLLM (the gpu extra); this module imports without it
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt
            from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

            params = SamplingParams(n=max(1, cfg.n), temperature=cfg.temperature, top_p=cfg.top_p,
                                    top_k=cfg.top_k if cfg.top_k > 0 else 0, max_tokens=cfg.max_new_tokens,
                                    stop=list(cfg.stop) or None, seed=cfg.seed,
                                    logprobs=max(self.settings.vllm.logprobs_topk, cfg.top_logprobs),
                                    output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
                                    structured_outputs=_structured(StructuredOutputsParams, cfg.grammar))
            samples = {i: Sample() for i in range(max(1, cfg.n))}
            raw_sets: dict[int, list[Mapping[int, float]]] = {i: [] for i in samples}
            handle.started_at = time.monotonic()
            watcher = asyncio.ensure_future(self._watch_cancel(handle))
            try:
                # vLLM's prefix cache is on by default and shared by every request: a hit answers faster, so
                # one tenant could time another's recent prompts. `cache_salt` (the tenant) keeps each
                # tenant's cached blocks its own, as shared/decoding/prompt_cache.py does for ours.
                prompt = TokensPrompt(prompt_token_ids=list(req.prompt_ids))
                if req.tenant:
                    prompt["cache_salt"] = req.tenant
                async for out in self._engine.generate(prompt, params, req.request_id, lora_request=lora):
                    cached = int(getattr(out, "num_cached_tokens", 0) or 0)
                    for c in out.outputs:
                        samples[c.index].cached_prompt_tokens = max(samples[c.index].cached_prompt_tokens, cached)
                        self._take(handle, samples[c.index], raw_sets[c.index], c)
            finally:
                watcher.cancel()
            for i, s in samples.items():                    # aborted before its last output
                if not handle.has_choice(i):
                    s.finish_reason = "cancelled"
                    s.logprobs = self._behaviour(cfg, s, raw_sets[i])
                    s.top_logprobs = self._alternatives(cfg, raw_sets[i])
                    handle.push_choice(i, s)
        except Exception as e:  # noqa: BLE001 - surfaced to the caller as INTERNAL; the engine keeps serving
            log.exception("vllm generation failed", extra={"version": req.version})
            handle.fail(EngineError(f"generation failed: {type(e).__name__}: {e}"))
        finally:
            with self._lock:
                self._inflight[req.version] -= 1

    def _take(self, handle: RequestHandle, s: Sample, raws: list[Mapping[int, float]], c: Any) -> None:
        """One output delta of one choice --> the sample (tokens, text, log-probs), a stream delta, the end."""
        new_ids = [int(t) for t in c.token_ids]
        s.token_ids.extend(new_ids)
        s.text += c.text
        for tid, lps in zip(new_ids, c.logprobs or [], strict=False):
            raw = {int(t): float(lp.logprob) for t, lp in lps.items()}
            s.logprobs_t1.append(raw[tid])
            raws.append(raw)
        if handle.request.stream and (new_ids or c.text):
            handle.push_delta(c.index, new_ids, c.text)
        if c.finish_reason is not None:
            s.finish_reason = "cancelled" if c.finish_reason == "abort" else str(c.finish_reason)
            s.logprobs = self._behaviour(handle.request.sampling, s, raws)
            s.top_logprobs = self._alternatives(handle.request.sampling, raws)
            handle.push_choice(c.index, s)

    @staticmethod
    def _behaviour(cfg: Any, s: Sample, raws: list[Mapping[int, float]]) -> list[float]:
        """Behaviour log-probs of a finished sample (one per token, from its raw top-K sets)."""
        return [behaviour_logprob(t, raw, cfg.temperature, cfg.top_k, cfg.top_p)
                for t, raw in zip(s.token_ids, raws, strict=True)]

    @staticmethod
    def _alternatives(cfg: Any, raws: list[Mapping[int, float]]) -> list[list[tuple[int, float]]]:
        """OpenAI's `top_logprobs` per token when asked (`cfg.top_logprobs`), from the same raw top-K sets as
        the behaviour log-probs (vLLM's `logprobs=K` output, K raised to at least the number asked)."""
        k = int(getattr(cfg, "top_logprobs", 0))
        if k <= 0:
            return []
        return [alternatives_from_raw(raw, cfg.temperature, cfg.top_k, cfg.top_p, k) for raw in raws]

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
        with self._swap_lock:
            if files.kind == "lora":
                self._load_lora(files)
            elif files.kind in ("full", ""):
                self._swap_full(files)
            else:
                raise ValueError(f"version {files.version}: unknown kind {files.kind!r} (full | lora)")
        log.info("version loaded", extra={"version": files.version, "kind": files.kind})

    def _load_lora(self, files: VersionFiles) -> None:
        # optional: vLLM (the gpu extra); this module imports without it
        from vllm.lora.request import LoRARequest

        if (files.base_version or BASE_VERSION) != self._full:
            raise ValueError(f"LoRA {files.version} applies to {files.base_version!r}; this engine holds the full "
                             f"weights {self._full!r}")
        require_safetensors(files.path, adapter=True)  # vLLM torch.loads adapter_model.bin when no safetensors
        with self._lock:
            if len(self._loras) >= self.settings.vllm.max_loras:
                raise ValueError(f"LoRA {files.version}: {len(self._loras)} adapters are loaded, the most this "
                                 f"engine holds (APPRENTICE_INFERENCE_ENGINE__MAX_LORAS={self.settings.vllm.max_loras})")
            lora_id = self._next_lora_id
            self._next_lora_id += 1
        lr = LoRARequest(lora_name=files.version, lora_int_id=lora_id, lora_path=str(files.path))
        if not self._run(self._engine.add_lora(lr), timeout=300):
            raise RuntimeError(f"vLLM did not load the LoRA adapter {files.version} from {files.path}")
        with self._lock:
            self._loras[files.version] = lr
            self._retired.pop(files.version, None)

    def _swap_full(self, files: VersionFiles) -> None:
        with self._lock:
            self._gate.clear()
        try:
            deadline = time.monotonic() + max(self.settings.grace_s, 30.0)
            while any(self._inflight.values()) and time.monotonic() < deadline:
                time.sleep(0.02)                           # admitted requests finish on the old weights
            if any(self._inflight.values()):
                raise RuntimeError(f"requests on {self._full} did not finish within the swap's wait")
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
                now = time.monotonic()
                for label in [self._full, *self._loras]:
                    self._retired[label] = now
                self._loras.clear()
                self._retired.pop(files.version, None)
                self._full, self._full_path = files.version, str(files.path)
            for lr in stale:                               # adapters of the old weights no longer apply
                self._run(self._engine.remove_lora(lr.lora_int_id), timeout=60)
        finally:
            self._gate.set()

    def unload_version(self, version: str) -> None:
        with self._lock:
            lr = self._loras.pop(version, None)
            if lr is not None:
                self._retired[version] = time.monotonic()
        if lr is None:
            return

        def remove_when_idle() -> None:
            deadline = time.monotonic() + 600
            while self._inflight.get(version, 0) and time.monotonic() < deadline:
                time.sleep(0.1)
            try:
                self._run(self._engine.remove_lora(lr.lora_int_id), timeout=60)
            except Exception:  # noqa: BLE001 - the adapter stays in vLLM's cache; nothing routes to it
                log.exception("removing LoRA %s failed", version)

        threading.Thread(target=remove_when_idle, name=f"vllm-unload-{version}", daemon=True).start()
