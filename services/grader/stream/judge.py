"""faust runtime, stage 3: interactions a judge grader needs --> judge groups --> judge results.

The judge agent owns the `judge-groups` table (key = group id): members gather until the group is
complete or its window ends (judge_groups.py), then one judge call per judge grader scores the group
together, and each member's result goes to the join topic as a join item, where the grade stage
applies it like any other event. A record the judge stage fails on is dead-lettered (`grader.judge`)
and the stream goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faust.types import EventT

from services.grader.core.join import TICK
from services.grader.core.judge_groups import JudgeGroup, add_member, judge_items
from services.grader.core.judge_groups import due as judge_due
from services.grader.stream.context import JoinItems, StageContext
from services.grader.stream.judge_client import JudgeBackend, judge_group, make_judge_backend
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)


class JudgeStage:
    def __init__(self, g: StageContext, backend: JudgeBackend | None = None) -> None:
        self.g = g
        self.backend = backend
        """Made on the first judge call (settings.judge_backend) unless given."""

    async def agent(self, stream: Any) -> None:
        async for ev in stream.events():
            try:
                await self._event(ev)
            except Exception as e:  # noqa: BLE001 - the judge stage must keep going
                log.exception("judge stage failed")
                await (await self.g.dead_letter(ev, "grader.judge", f"{type(e).__name__}: {e}", type(e).__name__))

    async def _event(self, ev: EventT) -> None:
        g = self.g
        key: bytes = ev.key or b""  # type: ignore[assignment]  # raw serializer: bytes
        value: bytes = ev.value or b""  # type: ignore[assignment]
        raw = g.judge_table.get(key)
        group = JudgeGroup.decode(raw) if raw else None
        if value[:1] == TICK:
            if group is not None:
                await self._judge_members(group.interactions())
                del g.judge_table[key]
            g.judge_due.pop(key, None)
            return
        it = events_pb2.Interaction.FromString(value[1:])
        task = g.joiner.task_for(it)
        step = add_member(group, it, value[1:], task, time.time())
        if step.ready:
            await self._judge_members(step.ready)
        if step.changed:
            if step.group is None:
                del g.judge_table[key]
            else:
                g.judge_table[key] = step.group.encode()
        if step.group is None:
            g.judge_due.pop(key, None)
        else:
            g.judge_due[key] = judge_due(step.group, task)

    async def _judge_members(self, members: list[events_pb2.Interaction]) -> None:
        """One judge call per judge grader for the group; results go to the join topic."""
        g = self.g
        task = g.joiner.task_for(members[0])
        if task is None:
            return
        if self.backend is None:
            self.backend = make_judge_backend(g.settings.judge_backend, endpoint=g.settings.inference_endpoint,
                                              tenant=g.settings.judge_tenant)
        items: JoinItems = {}
        for spec in task.judges:
            for key, value in judge_items(spec, await judge_group(self.backend, spec, members)):
                g.add_join_item(items, key, value)
        futs = await g.send_bundles(g.settings.join_topic, items)
        if futs:
            await asyncio.gather(*futs)
