"""faust runtime, stage 1: source records (interactions, feedback) --> join items on the join topic.

`route` first checks who wrote each record (shared/kafka/trust.py: interactions signed by inference,
feedback by a principal allowed to write it, no signature replayed at another offset), then decodes and validates (undecodable, invalid or unconfigured records go to the dead-letter
topic, and the stream goes on) and re-partitions by interaction id (murmur2, explicit partition), so an
interaction and its feedback meet in the same partition of the `pending` table whatever partitioner
their producers used. Items for one partition travel as one bundle record per batch (join.py).
Interactions a judge grader needs also go to the judge topic, keyed by group id.

Each batch runs under poison.run_bisecting and never raises: an exception reaching faust's agent
supervisor restarts the agent without the batch in hand, and those records are lost (README.md,
"Exactly-once effect"). Retrying is safe: routing is idempotent downstream (event ids).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from faust.types import EventT

from services.grader.core.poison import POISON_STAGE, Failure, run_bisecting
from services.grader.core.routing import route
from services.grader.stream.context import JoinItems, StageContext
from shared.kafka.trust import UntrustedRecord

TRUST_STAGE = "grader.trust"
"""The dead letters' stage of a source record refused for who wrote it (or a replay)."""


class RouteStage:
    def __init__(self, g: StageContext) -> None:
        self.g = g

    async def agent(self, stream: Any) -> None:
        settings = self.g.settings
        async for events in stream.take_events(settings.batch_max, within=settings.batch_within_s):
            await run_bisecting(list(events), self.batch, poison=self._poison, stage="route")

    async def batch(self, events: Sequence[EventT]) -> None:
        g = self.g
        join_items: JoinItems = {}
        judge_items: list[tuple[bytes, bytes]] = []
        futs: list[Awaitable[Any]] = []
        for ev in events:
            dead = await self._route_one(ev, join_items, judge_items)
            if dead is not None:
                futs.append(dead)
        futs.extend(await g.send_bundles(g.settings.join_topic, join_items))
        for key, value in judge_items:
            futs.append(await g.send(g.settings.judge_topic, key, value))
        if futs:
            await asyncio.gather(*futs)

    async def _route_one(self, ev: EventT, join_items: JoinItems,
                         judge_items: list[tuple[bytes, bytes]]) -> Awaitable[Any] | None:
        """Validate one source record and queue its join item; a dead letter's future when rejected."""
        g = self.g
        msg = ev.message
        try:  # who wrote it, before anything of it is decoded (shared/kafka/trust.py)
            g.trust.check_record(msg.topic, ev.key, ev.value, msg.headers, partition=msg.partition,
                                 offset=msg.offset)
        except UntrustedRecord as e:
            return await g.dead_letter(ev, TRUST_STAGE, str(e), type(e).__name__)
        r = route(ev.message.topic == g.topic_names["interactions"], ev.value, g.joiner.task_of,
                  ev.message.headers, limits=g.joiner.limits)
        if r.rejected is not None:
            return await g.dead_letter(ev, r.rejected.stage, r.rejected.reason, r.rejected.error_type,
                                       r.rejected.tenant)
        if r.join is not None:
            g.add_join_item(join_items, *r.join)
        if r.judge is not None:
            judge_items.append(r.judge)
        return None

    async def _poison(self, ev: EventT, failure: Failure) -> None:
        """A source record that every batch holding it failed on (poison.py): dead-lettered on its own."""
        await (await self.g.dead_letter(ev, POISON_STAGE, f"every batch holding this record failed the same way: "
                                                          f"{failure.signature}", "PoisonRecord"))
