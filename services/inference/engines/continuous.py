"""Queued requests --> rows that join and leave running batches between decode steps (continuous batching).

The transformers engine's default scheduler, on its one scheduler thread. Each loop:
1. run between-step tasks, make finished LoRA loads resident (adapter_cache.py), and take newly
   submitted requests into `Admission` (per-tenant queues; rows x tokens budget; see
   services/inference/scheduler.py);
2. drop waiting requests that were cancelled or passed their deadline (their rows end `cancelled` at once),
   and fail those whose adapter could not be loaded;
3. preempt: a tenant that borrowed more than its share while alone gives the excess back when another
   tenant waits (its rows with the fewest tokens so far leave their batch unfinished and wait again,
   first in their tenant's queue; shared/decoding/batch.py `evict`);
4. admit rows: each admitted group is prefilled and merged into its backbone's running `DecodeBatch`. A
   request whose LoRA adapter is not resident is not eligible yet (its load runs in the background), so
   it waits without holding back anyone else's rows;
5. one decode step for every running batch (one batch per set of full weights; rows of different LoRA
   adapters of those weights share it, each row with its own adapter); finished rows leave at once and
   return their reservation to the budget.
A request's n rows may join over several steps; each row keeps its own sampling parameters, seed,
stop strings and budget, so its tokens and log-probs do not depend on when it joined.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field

from services.inference import metrics
from services.inference.engines.base import EngineError, RequestHandle
from services.inference.engines.transformers_types import Backbone, Policy, Queued, SchedulerHost
from services.inference.scheduler import Admission, Budget
from shared.decoding.batch import DecodeBatch
from shared.decoding.params import Sample
from shared.decoding.prompt_cache import PromptCache
from shared.decoding.rows import DecodeRow

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    """A request taken from the engine's queue: its rows, which wait for admission, how many finished."""

    q: Queued
    rows: list[DecodeRow]
    tenant: str
    ready: list[int] = field(default_factory=list)   # rows waiting for admission (preempted ones first)
    started: bool = False
    finished: int = 0
    row_tokens: int = 0                     # tokens each admitted row reserves (set at admission)
    held: set[int] = field(default_factory=set)   # rows admitted and not finished (their reservation)

    @property
    def handle(self) -> RequestHandle:
        return self.q.handle

    @property
    def policy(self) -> Policy:
        return self.q.policy


class ContinuousScheduler:
    """Drives a `TransformersEngine`'s queue (transformers_types.py `SchedulerHost`) with continuous batching;
    `run()` is the scheduler thread."""

    def __init__(self, engine: SchedulerHost) -> None:
        s = engine.settings
        self.engine = engine
        self.admission: Admission[_Request] = Admission(Budget(
            max_rows=s.max_batch_rows, max_tokens=s.max_batch_tokens, tenant_share=s.tenant_batch_share,
            max_overtake_s=s.max_overtake_s, borrow_after_s=s.tenant_borrow_after_s))
        self.requests: list[_Request] = []          # taken from the engine queue, not done
        self.batches: dict[int, tuple[Backbone, DecodeBatch]] = {}   # id(backbone) -> its running batch
        self._tokens_at, self._tokens = time.monotonic(), 0

    # --- the loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        eng = self.engine
        while True:
            eng._run_tasks()
            eng.adapters.commit()
            if not self._intake():
                break
            self._sweep()
            self._preempt()
            self._admit()
            metrics.ROWS_IN_FLIGHT.set(self.admission.rows_in_flight)
            metrics.TOKENS_RESERVED.set(self.admission.tokens_in_flight)
            for key in list(self.batches):
                self._step(key)
            if not self.batches and self.requests:      # only requests waiting for an adapter: sleep until
                with eng._cv:                           # a load finishes (it notifies) or something arrives
                    if not eng._queue and not eng._tasks and not eng._stopping:
                        eng._cv.wait(0.05)
        eng._run_tasks()

    def _intake(self) -> bool:
        """Move submitted requests into admission; on an idle engine wait for work (and `batch_wait_ms` for
        company). False once stopping with nothing left."""
        eng = self.engine
        with eng._cv:
            if not self.batches and not self.requests:
                while not eng._queue and not eng._tasks and not eng._stopping:
                    eng._cv.wait(0.5)
                if eng._queue and not eng._stopping:       # idle: let a burst arrive together
                    until = time.monotonic() + eng.settings.batch_wait_ms / 1000.0
                    while (left := until - time.monotonic()) > 0 and not eng._stopping:
                        eng._cv.wait(left)
            while eng._queue:
                self._take(eng._queue.popleft())
            metrics.QUEUE_DEPTH.set(len(self.admission.waiting()))
            eng._running = [r.q for r in self.requests]
            return not (eng._stopping and not self.requests and not eng._queue and not eng._tasks)

    def _take(self, q: Queued) -> None:
        eng = self.engine
        h, req = q.handle, q.handle.request
        n = max(1, req.sampling.n)
        r = _Request(q, [], req.tenant or "", ready=list(range(n)))
        for i in range(n):
            r.rows.append(DecodeRow(
                prompt_ids=req.prompt_ids, params=req.sampling, sample_index=i, stream=req.stream,
                cache_salt=r.tenant,
                on_delta=functools.partial(h.push_delta, i),
                on_finish=functools.partial(self._row_finished, r, i), cancelled=h.cancelled))
        tokens = max(1, min(len(req.prompt_ids) + max(0, req.sampling.max_new_tokens), eng.context_window))
        self.requests.append(r)
        self.admission.push(r, r.tenant, n, tokens)

    def _sweep(self) -> None:
        """Waiting requests that were cancelled (client gone, deadline) end now, without waiting for room;
        those whose adapter failed to load fail (the adapter is tried again for later requests)."""
        cache = self.engine.adapters
        broken: dict[str, str] = {}
        for r in self.admission.waiting():
            if r.handle.cancelled():
                self.admission.drop(r)
                left, r.ready = r.ready, []
                for i in left:
                    r.rows[i].finish("cancelled", self.engine._eos, self.engine._tok)
                continue
            adapter = r.policy.adapter
            if adapter is None:
                continue
            err = broken.get(adapter)
            if err is None:
                err = broken[adapter] = cache.failed(adapter)
            if err:
                self.admission.drop(r)
                left, r.ready = r.ready, []
                for i in left:
                    r.rows[i].done = True
                r.finished += len(left)
                r.handle.fail(EngineError(f"adapter {adapter} could not be loaded: {err}"))
                r.handle.cancel()
                if r.finished == len(r.rows):
                    self._forget(r)
        for adapter, err in broken.items():
            if err:
                cache.forget_error(adapter)

    def _admit(self) -> None:
        cache = self.engine.adapters

        def eligible(r: _Request) -> bool:
            got = self.batches.get(id(r.policy.backbone))
            if got is not None and not got[1].can_join:
                return False
            return r.policy.adapter is None or cache.ready(r.policy.adapter)

        groups: dict[int, list[DecodeRow]] = {}
        now = time.monotonic()
        requests = 0
        for r, n, tokens in self.admission.admit(eligible):
            r.row_tokens = tokens                   # as charged (a row larger than a share is clamped)
            if not r.started:
                r.started = True
                r.handle.started_at = now
                metrics.QUEUE_SECONDS.observe(now - r.handle.submitted_at)
                requests += 1
            picked, r.ready = r.ready[:n], r.ready[n:]
            new = [r.rows[i] for i in picked]
            if r.policy.adapter is not None:        # pinned while its rows run: never evicted under them
                slot = cache.acquire(r.policy.adapter, n)
                for row in new:
                    row.adapter = slot
            r.held.update(picked)
            groups.setdefault(id(r.policy.backbone), []).extend(new)
        if requests:
            metrics.BATCH_REQUESTS.observe(requests)
        by_key = {id(r.policy.backbone): r.policy.backbone for r in self.requests}
        for key, rows in groups.items():
            bb = by_key[key]
            if key not in self.batches:
                if bb.prompts is None:
                    bb.prompts = PromptCache(self.engine.settings.prompt_cache_bytes)
                self.batches[key] = (bb, DecodeBatch(bb.model, self.engine._tok, eos_ids=self.engine._eos,
                                                     context_window=self.engine._ctx, router=bb.lora,
                                                     cache=bb.prompts))
            batch = self.batches[key][1]
            if batch.router is None:        # the backbone's first adapter arrived while this batch ran
                batch.router = bb.lora      # (slot 0 rows already in it keep the base weights)
            before, cached = batch.stats.tokens, batch.stats.cached_prompts
            try:
                batch.add(rows)
            except Exception as e:  # noqa: BLE001 - one broken prefill must not stop the engine
                log.exception("prefill failed", extra={"version": bb.version, "rows": len(rows)})
                self._fail(list(rows), e)
            self._count(batch.stats.tokens - before)
            if batch.stats.cached_prompts > cached:
                metrics.PROMPT_CACHE_HITS.inc(batch.stats.cached_prompts - cached)
            if not batch.live:
                self.batches.pop(key, None)

    def _preempt(self) -> None:
        """Rows of tenants over their share while another tenant waits leave their batches unfinished and
        wait again (the cheapest to recompute first: fewest tokens so far). Batches whose cache layout
        cannot take rows back are left alone."""
        excess = self.admission.over_share()
        if not excess:
            return
        where = {id(row): key for key, (_, batch) in self.batches.items() if batch.can_join for row in batch.live}
        for tenant, (rows, tokens) in excess.items():
            running = [(r, i) for r in self.requests if r.tenant == tenant for i in r.held
                       if id(r.rows[i]) in where and not r.rows[i].done]
            running.sort(key=lambda ri: len(ri[0].rows[ri[1]].sample.token_ids))
            out: dict[int, list[DecodeRow]] = {}
            back: dict[int, tuple[_Request, int]] = {}
            for r, i in running:
                if rows <= 0 and tokens <= 0:
                    break
                out.setdefault(where[id(r.rows[i])], []).append(r.rows[i])
                self._unhold(r, i)
                r.ready.insert(0, i)
                rows, tokens = rows - 1, tokens - r.row_tokens
                back[id(r)] = (r, back.get(id(r), (r, 0))[1] + 1)
            for key, evicted in out.items():
                self.batches[key][1].evict(evicted)
                if not self.batches[key][1].live:
                    self.batches.pop(key, None)
            for r, n in back.values():
                self.admission.requeue(r, r.tenant, n, r.row_tokens)
                metrics.PREEMPTED_ROWS.inc(n)

    def _step(self, key: int) -> None:
        bb, batch = self.batches[key]
        before = batch.stats.tokens
        metrics.BATCH_ROWS.observe(len(batch))
        try:
            batch.step()
        except Exception as e:  # noqa: BLE001 - one broken batch must not stop the engine
            log.exception("decode step failed", extra={"version": bb.version, "rows": len(batch)})
            self.batches.pop(key, None)
            self._fail(batch.live, e)
            return
        self._count(batch.stats.tokens - before)
        if not batch.live:
            self.batches.pop(key, None)

    # --- bookkeeping ----------------------------------------------------------------------------------
    def _unhold(self, r: _Request, index: int) -> None:
        """Row `index` of `r` left its batch: its budget reservation and its adapter pin return."""
        if index in r.held:
            r.held.discard(index)
            self.admission.release(r.tenant, r.row_tokens)
            if r.policy.adapter is not None:
                self.engine.adapters.release(r.policy.adapter)

    def _row_finished(self, r: _Request, index: int, sample: Sample) -> None:
        self._unhold(r, index)
        if sample.token_ids:
            metrics.GENERATED_TOKENS.labels(version=r.policy.version).inc(len(sample.token_ids))
        r.finished += 1
        r.handle.push_choice(index, sample)
        if r.finished == len(r.rows):
            self._forget(r)

    def _forget(self, r: _Request) -> None:
        if r in self.requests:
            self.requests.remove(r)
            eng = self.engine
            with eng._cv:
                eng._running = [x.q for x in self.requests]

    def _fail(self, rows: list[DecodeRow], error: BaseException) -> None:
        """A forward pass over `rows` failed: those rows are gone (their reservations return), and the
        requests owning them fail; their other rows end `cancelled` at their next step or sweep."""
        failed = EngineError(f"generation failed: {type(error).__name__}: {error}")
        lost = {id(row) for row in rows if not row.done}
        for r in list(self.requests):
            mine = [i for i, row in enumerate(r.rows) if id(row) in lost]
            if not mine:
                continue
            for i in mine:
                r.rows[i].done = True
                self._unhold(r, i)
                r.finished += 1
            r.handle.fail(failed)
            r.handle.cancel()
            if r.finished == len(r.rows):
                self._forget(r)

    def _count(self, tokens: int) -> None:
        """Tokens/s over the last second (per-version token counts are added as rows finish: a batch
        mixes versions)."""
        if tokens <= 0:
            return
        self._tokens += tokens
        now = time.monotonic()
        if now - self._tokens_at >= 1.0:
            metrics.TOKENS_PER_SECOND.set(self._tokens / (now - self._tokens_at))
            self._tokens_at, self._tokens = now, 0
