"""faust runtime: the wall clock --> tick items (windows, retention, judge groups) + stall repairs.

Windows and retention are wall-clock timers: due keys get a tick record on the join topic (or the
judge topic), so that every state change still happens inside its agent, in partition order. The same
timer settles join partitions that received no record since this worker got them (their windows must
still close; recovery.py) and runs the stall watchdog (core/stall.py: a stream partition whose commit
stays short of its end is re-read from its committed offset).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from services.grader import metrics as M
from services.grader.core.join import TICK
from services.grader.core.judge_groups import JudgeGroup
from services.grader.core.judge_groups import due as judge_due
from services.grader.core.stall import StallTracker
from services.grader.stream.context import JoinItems, StageContext

log = logging.getLogger(__name__)

TICK_RETRY_S = 30.0
"""A tick that was sent but has not changed the key's due time is sent again after this long."""


class Ticker:
    def __init__(self, g: StageContext) -> None:
        self.g = g
        self._stalls = StallTracker(g.settings.stall_after_s)
        self._stall_check_at = 0.0
        self._rules_seen = g.joiner.book.revision

    async def run(self) -> None:
        """(faust task) Every `tick_interval_s` until the app stops; a failed tick is retried next time."""
        interval = self.g.settings.tick_interval_s
        while not self.g.stopping:
            await asyncio.sleep(interval)
            try:
                await self.tick(time.time())
            except Exception:  # noqa: BLE001 - a failed tick is retried next interval
                log.exception("tick failed")

    async def tick(self, now: float) -> None:
        g = self.g
        join_topic = g.settings.join_topic
        active = g.active_partitions(join_topic)
        ready = g.ready
        recovery = g.recovery
        if active - recovery.settled and ready:
            # A partition with no new records since this worker got it still has windows to close.
            async with recovery.lock:
                await recovery.settle_new(g.active_partitions(join_topic))
        if g.ready and now >= self._stall_check_at:
            self._stall_check_at = now + min(5.0, g.settings.stall_after_s / 2)
            try:
                await self._unstall(now)
            except Exception:  # noqa: BLE001 - a failed check must not hold back the timers below
                log.exception("stall check failed")
        ticks: JoinItems = {}
        open_count = 0
        if self._rules_seen != g.joiner.book.revision:  # a rule set or deleted at run time: every open window
            self._rules_seen = g.joiner.book.revision   # is looked at again under the new rules
            for key, (_due, open_, p) in list(g.due.items()):
                if open_:
                    g.due[key] = (now, open_, p)
            log.info("grading rules changed; looking at every open window again")
        for key, (due, open_, p) in list(g.due.items()):
            open_count += open_
            if due <= now and p in active:
                ticks.setdefault(p, []).append((key, TICK))
                g.due[key] = (now + TICK_RETRY_S, open_, p)
        futs: list[Awaitable[Any]] = await g.send_bundles(join_topic, ticks)
        judge_active = g.active_partitions(g.settings.judge_topic)
        for key, due in list(g.judge_due.items()):
            if due <= now:
                futs.append(await g.send(g.settings.judge_topic, key, TICK))
                g.judge_due[key] = now + TICK_RETRY_S
        if not g.judge_due and judge_active:
            # After a restart the in-memory due list is empty: rebuild it from the (small) judge table.
            for key, raw in list(g.judge_table.data.items()):
                if raw is not None:
                    group = JudgeGroup.decode(raw)
                    first = group.interactions()[:1]
                    g.judge_due[key] = judge_due(group, g.joiner.task_for(first[0]) if first else None)
        if futs:
            await asyncio.gather(*futs)
        M.PENDING.set(open_count)
        M.export_stats(g.stats)
        M.export_waiting(g.waiting, g.joiner)

    async def _unstall(self, now: float) -> None:
        """Resume and seek back to their committed offset the source and join partitions whose commit
        stopped short of their end (stall.py says why this is needed and safe)."""
        g = self.g
        streams = {g.topic_names["interactions"], g.topic_names["feedback"], g.settings.join_topic}
        tps = g.assigned(streams)
        if not tps:
            return
        consumer = g.consumer
        ends = await consumer.highwaters(*tps)
        committed = consumer._committed_offset  # type: ignore[attr-defined]  # faust: set by perform_seek and commits
        by_key = {(tp.topic, tp.partition): tp for tp in tps}
        todo = self._stalls.stalled({(tp.topic, tp.partition): int(o) for tp, o in ends.items() if o is not None},
                                    {k: committed.get(tp) for k, tp in by_key.items()}, now)
        for key, offset in todo.items():
            tp = by_key[key]
            log.warning("a stream partition's commit is stuck before its end; re-reading it from there",
                        extra={"partition": f"{tp.topic}/{tp.partition}", "offset": offset,
                               "end": ends.get(tp)})
            consumer.resume_partitions([tp])
            await consumer.seek(tp, offset)
