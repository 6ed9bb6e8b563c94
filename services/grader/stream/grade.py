"""faust runtime, stage 2: join records --> states in the `pending` table + graded records.

The grade agent owns the table and applies `join.Joiner` (pure) to each item. A batch goes in three
acknowledged phases, so that a crash anywhere leaves either nothing to redo or emissions that
recovery.py can settle:

  (a) every changed state to the changelog, acknowledged; a state that emits carries the batch's
      sequence and wall clock (`pending_seq`, `pending_ts`: the emission marker);
  (b) the graded records, acknowledged;
  (c) `__confirmed__/<partition> = seq` to the changelog.

A batch that fails is retried (poison.run_bisecting; its partitions are settled again first, since it
may have left emissions in doubt), split when one item makes it fail the same way twice, and that
item alone is dead-lettered. No exception may reach faust's agent supervisor: it would restart the
agent without the batch in hand, and the batch's records would be lost (README.md, "Exactly-once
effect").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from typing import Any, NamedTuple

from faust.types import EventT

from services.grader import metrics as M
from services.grader.core.bundles import BadJoinRecord, decode_bundle
from services.grader.core.join import Rejected, Step, letter_value
from services.grader.core.limits import oversize
from services.grader.core.poison import POISON_STAGE, Failure, run_bisecting
from services.grader.core.routing import GRADED_HEADERS
from services.grader.core.state import PendingState, encode_seq, seq_key
from services.grader.stream.context import StageContext
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)


class Item(NamedTuple):
    """One join item of a grade batch, with the join record it came in (the unit the grade stage retries,
    splits and, as a last resort, dead-letters)."""

    ev: EventT
    key: bytes
    value: bytes
    error: str = ""
    """Why the join record could not be read as a bundle ("" = a readable item)."""


def items_of(events: Sequence[EventT]) -> list[Item]:
    out = []
    for ev in events:
        try:
            out += [Item(ev, key, value) for key, value in decode_bundle(ev.value)]  # type: ignore[arg-type]
        except BadJoinRecord as e:
            out.append(Item(ev, b"", b"", str(e)))
    return out


class GradeStage:
    def __init__(self, g: StageContext) -> None:
        self.g = g
        point, _, count = g.settings.fault_injection.partition(":")
        self._fault = (point, int(count)) if point else None
        self._emitting_batches = 0

    async def agent(self, stream: Any) -> None:
        settings = self.g.settings
        async for events in stream.take_events(settings.batch_max, within=settings.batch_within_s):
            start = time.perf_counter()
            parts = {ev.message.partition for ev in events}
            # A failed batch may have left emissions in doubt: settle its partitions again before the retry.
            await run_bisecting(items_of(events), self.batch, poison=self._poison, stage="grade",
                                on_error=functools.partial(self.g.recovery.forget, parts))
            M.BATCH_SECONDS.observe(time.perf_counter() - start)

    async def batch(self, items: Sequence[Item]) -> None:
        recovery = self.g.recovery
        # The lock orders this batch with a settle started by the ticker (both touch the table).
        async with recovery.lock:
            await recovery.settle_new({item.ev.message.partition for item in items})
            await self._apply(items)

    async def _apply(self, items: Sequence[Item]) -> None:
        g = self.g
        now = time.time()
        seq = g.recovery.next_seq()
        data = g.table.data
        current: dict[bytes, bytes | None] = {}
        partition_of: dict[bytes, int] = {}
        dirty: list[bytes] = []
        emits: list[tuple[events_pb2.GradedInteraction, int]] = []
        dead: list[Awaitable[Any]] = []
        for ev, key, value, error in items:
            p = ev.message.partition
            if error:  # the join record is not a bundle
                dead.append(await g.dead_letter(ev, "grader.join", error, BadJoinRecord.__name__))
                continue
            raw = current[key] if key in current else data.get(key)
            try:
                state = PendingState.decode(raw) if raw is not None else None
            except ValueError as e:
                step: Step | Rejected = Rejected("grader.join", f"unreadable state: {e}", type(e).__name__)
            else:
                step = g.joiner.apply_guarded(state, key, value, now, p)
            blob: bytes | None = None
            if not isinstance(step, Rejected):
                if step.emit is not None and step.state is not None:  # the emission marker goes with the state
                    step.state.pending_seq, step.state.pending_ts = seq, now
                blob = step.state.encode() if step.changed and step.state is not None else None
                too_big = oversize(len(blob or b""), step.emit, g.joiner.limits)
                if too_big is not None:
                    step = Rejected(too_big.stage, too_big.reason, "Refused")
            if isinstance(step, Rejected):
                dead.append(await g.dead_letter(ev, step.stage, step.reason, step.error_type,
                                                step.tenant, key=key, value=letter_value(step, value)))
                continue
            for body, why in step.refused:
                dead.append(await g.dead_letter(ev, why.stage, why.reason, why.error_type, why.tenant,
                                                key=key, value=body))
            M.count_event(value[:1].decode(errors="replace"), step.note or ("emitted" if step.emit else "applied"))
            partition_of[key] = p
            if step.emit is not None and step.state is not None:
                emits.append((step.emit, p))
            if step.changed:
                current[key] = blob
                if key not in dirty:
                    dirty.append(key)
            if step.state is None:
                g.due.pop(key, None)
                g.waiting.discard(key.decode(errors="replace"))
            else:
                due, open_ = g.joiner.due(step.state)
                g.due[key] = (due, open_, p)
                g.waiting.update(key.decode(errors="replace"), step.state, open_)

        # (a) states, with their emission markers, durable before any record leaves; the table takes
        # them only then, so that a batch that fails here is applied again from the states before it
        changelog = g.changelog_name(g.table)
        futs = [await g.send(changelog, key, current[key], partition_of[key]) for key in dirty]
        if futs:
            await asyncio.gather(*futs)
        for key in dirty:
            new = current[key]
            if new is None:
                data.pop(key, None)
            else:
                data[key] = new
        if emits:
            self._emitting_batches += 1
            self._maybe_crash("after_state")
            if self._fault == ("fail_after_state", self._emitting_batches):
                raise TimeoutError("fault injection: a batch failed after its state write")
        # (b) the graded records
        graded = g.topic_names["graded"]
        futs = [await g.send(graded, rec.interaction.session_id.encode() or None, rec.SerializeToString(),
                             headers=GRADED_HEADERS) for rec, _ in emits]
        if futs:
            await asyncio.gather(*futs)
        if emits:
            self._maybe_crash("after_emit")
        # (c) confirm: every emission of this batch is in the graded topic
        for p in sorted({p for _, p in emits}):
            k, v = seq_key(p).encode(), encode_seq(seq)
            data[k] = v
            dead.append(await g.send(changelog, k, v, p))
        if dead:
            await asyncio.gather(*dead)
        for rec, _ in emits:
            M.count_emitted(rec)
        log.debug("join batch done", extra={"items": len(items), "states": len(dirty), "emitted": len(emits)})

    async def _poison(self, item: Item, failure: Failure) -> None:
        """One join item that every batch holding it failed on: dead-lettered on its own."""
        await (await self.g.dead_letter(item.ev, POISON_STAGE, f"every batch holding this join item failed the "
                                                               f"same way: {failure.signature}", "PoisonRecord",
                                        key=item.key or None, value=item.value or None))

    def _maybe_crash(self, point: str) -> None:
        """Tests only (settings.py `fault_injection`): exit as kill -9 would, at an in-doubt point."""
        if self._fault is not None and self._fault == (point, self._emitting_batches):
            log.warning("fault injection: exiting abruptly", extra={"point": point})
            os._exit(137)
