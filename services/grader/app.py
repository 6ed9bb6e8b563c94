"""Interactions + FeedbackEvents (Kafka) --> GradedInteractions (Kafka): the grader's faust runtime.

(`APPRENTICE_GRADER_RUNTIME=faust`; the default runtime is native_runtime.py. Both apply the same pure
core: routing.py, join.py, components.py, detectors.py, judge_groups.py.)

Stages (all in one faust app, id = topic prefix + `apprentice-grader`):

    interactions, feedback --route--> <app>-join --grade--> graded (key = session id)
                                  \\--> <app>-judge (key = group id) --judge--> <app>-join (judge results)
    ticker (every tick_interval_s): due windows / retention --> tick items on <app>-join

`route` decodes and validates (undecodable or unconfigured records go to the dead-letter topic, and
the stream goes on) and re-partitions by interaction id (murmur2, explicit partition), so an interaction
and its feedback meet in the same partition of the `pending` table whatever partitioner their producers
used. Items for one partition travel as one bundle record per batch (join.py). `grade` owns the table
and applies `services.grader.join.Joiner` (pure) to each item.

Exactly-once effect (no double emission of a revision, nothing lost, across kill -9)
------------------------------------------------------------------------------------
Faust commits a source offset only after the agent finished the record, so after a crash every record
past the last commit is processed again, against the table as restored from its changelog. Three
things make that replay harmless:

1. Idempotent state. Each state remembers the event ids it applied and its last emitted revision and
   content digest; replaying an applied event changes nothing and emits nothing.
2. An emission marker, written *before* the emission. `grade` processes a batch in three phases:
   (a) write every changed state to the changelog and wait until Kafka acknowledged them; a state
       that emits carries `pending_seq = s` (this batch's sequence, increasing per worker, above every
       sequence seen in recovered data) and `pending_ts` (the wall clock before sending);
   (b) send the graded records and wait for their acknowledgements;
   (c) write `__confirmed__/<partition> = s` to the changelog.
   After a crash, a restored state with revision r either has `pending_seq <= confirmed` (its record
   was acknowledged in (b) before (c) was written), or `pending_seq > confirmed` (the crash fell between
   (a) and (c): the record may or may not be in the graded topic). Only these few states are in
   doubt. Before the grade agent processes the first record of a partition it (newly) owns, `settle`
   reads the graded topic from `pending_ts - verify_margin_s` (Kafka's time index finds the offset)
   and looks for each in-doubt record's deterministic event id uuid5(interaction id, r): found ->
   already emitted; absent -> emitted now. Then it confirms. A state whose changelog write was lost in
   (a) had emitted nothing (b comes after a), so its source record is simply replayed. Confirmations
   never hide an in-doubt state: settling happens before any new batch of that partition (whose (c)
   would raise the confirmed sequence), and sequences only grow. Hence each (interaction, revision) reaches the graded
   topic once, and deterministic event ids let any consumer drop a copy that a broker-level producer
   retry might still create (the producer is idempotent, so even that should not happen).
   Assumption: one worker owns a partition at a time (faust's rebalancing; a zombie worker fenced only
   by the session timeout is outside this argument, as for any non-transactional Kafka app).

3. Nothing skipped. faust's at-least-once consumer can skip records around rebalances; four
   mechanisms and their fixes are in `_LosslessConsumer` (each was reproduced by a restart test), and a
   stall watchdog (stall.py) re-reads any stream partition whose commit stays short of its end.
   And no batch is dropped: an exception inside an agent's batch would reach faust's supervisor,
   which restarts the agent without the batch in hand (those records are never delivered to this
   worker again); every batch is therefore retried until it succeeds (`_until_done`).

Faust's own `exactly_once` guarantee is not used: its transaction manager only handles sends to
partitions of the app's source topics, and the graded topic is not one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, NamedTuple

import faust
from confluent_kafka import Consumer, TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT

from services.grader import metrics as M
from services.grader.changelog import ensure_internal_topics
from services.grader.commit_offsets import committable
from services.grader.config import GraderSettings
from services.grader.detectors import DetectorStats
from services.grader.join import (
    TICK,
    BadJoinRecord,
    Joiner,
    Rejected,
    Step,
    decode_bundle,
    encode_bundles,
    graded_event_id,
    letter_value,
    partition_for,
)
from services.grader.judge_client import JudgeBackend, judge_group, make_judge_backend
from services.grader.judge_groups import JudgeGroup, add_member, judge_items
from services.grader.judge_groups import due as judge_due
from services.grader.limits import limits_of, oversize
from services.grader.poison import POISON_STAGE, Failure, classify, run_bisecting
from services.grader.routing import DEADLETTER_HEADERS, GRADED_HEADERS, dead_letter, route
from services.grader.runtime import GraderRuntime
from services.grader.stall import StallTracker
from services.grader.state import SEQ_KEY_PREFIX, PendingState, decode_seq, encode_seq, seq_key
from shared.grading import GraderConfig
from shared.kafka.client_logs import client_log_config
from shared.kafka.security import faust_credentials, librdkafka_config
from shared.proto.apprentice.v1 import events_pb2
from shared.validation import KafkaHeaders

log = logging.getLogger(__name__)

SOURCE = "grader"
TICK_RETRY_S = 30.0
"""A tick that was sent but has not changed the key's due time is sent again after this long."""


class _IdempotentProducer(faust_aiokafka.Producer):
    """faust's aiokafka producer with `enable_idempotence` (faust only sets it under exactly_once):
    broker-side de-duplication of retried batches, so a retry never writes a graded record twice."""

    def _settings_extra(self) -> dict[str, Any]:
        return {"acks": "all", "enable_idempotence": True}


class _NoReadOffsets(dict):  # type: ignore[type-arg]
    """A read-offset map that never remembers (see _LosslessConsumer)."""

    def __getitem__(self, key: Any) -> None:
        return None


class _ReadCommittedThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, reading read_committed: the native runtime writes the join topic and the
    table changelogs in transactions, and after a switch of runtime the records of its aborted batches
    must not become state here (faust reads read_committed only under its own exactly_once mode)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # read by AIOKafkaConsumer.start()
        return consumer


class _LosslessConsumer(faust_aiokafka.Consumer):
    """faust's consumer, minus four ways it loses records around rebalances (each reproduced by
    tests/integration/test_grader_restart.py before this class existed):

    1. After recovery faust seeks stream partitions "to their committed offset", but aiokafka skips the
       seek for a partition without a committed offset, leaving the position after records that faust
       fetched and then dropped from its queues while recovering. Such partitions are rewound to their
       beginning (auto_offset_reset).
    2. faust drops a fetched record whose offset is below the partition's last *read* offset. A seek
       during start-up (faust seeks twice) followed by a stale pre-seek batch moves that read offset past
       records that were never delivered; their re-fetch is then dropped. Here nothing is dropped
       (`_read_offset` never remembers): a re-delivered record is replayed, which the grader's state
       machine de-duplicates by event id.
    3. faust treats a jump in offsets as a "gap" (transaction markers, compaction) and counts the
       skipped offsets as acknowledged, so the commit moves past records that were lost as in 2. Here
       the commit decides from what was *fetched* instead (commit_offsets.py): an offset never fetched
       (a marker, an aborted transaction) is skipped, a fetched one is waited for.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = _NoReadOffsets()
        self._fetched: dict[TP, set[int]] = {}
        """Source-topic offsets fetched and not yet committed over, per partition."""

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ReadCommittedThread(self, loop=self.loop, beacon=self.beacon)

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        return None

    async def _wait_next_records(self, timeout: float) -> tuple[Any, Any]:
        records, active = await super()._wait_next_records(timeout)
        if records:
            acks_enabled_for = self.app.topics.acks_enabled_for
            for tp, batch in records.items():
                if acks_enabled_for(tp.topic) and not tp.topic.endswith("-join"):  # what _new_offset decides
                    self._fetched.setdefault(tp, set()).update(r.offset for r in batch)
        return records, active

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        await super().on_partitions_revoked(revoked)
        for tp in revoked:
            self._fetched.pop(tp, None)

    def _new_offset(self, tp: TP) -> int | None:
        """4. faust's commit skips one unacknowledged record: `_committed_offset` holds the next offset to
        read (what it commits), but the hole check is `min(acked) - committed > 1`, so with offsets
        12, 13, 14 acknowledged and 11 not, it commits 15 and record 11 is never processed (reproduced
        by the `after_state` restart test with frequent commits: its items never graded); and with no
        commit yet (or one at offset 0) it checks nothing. On the join topic, which only the grader
        writes and faust writes without transactions (contiguous offsets), any unacknowledged offset
        below an acknowledged one is a hole: nothing is committed until it fills (the stall watchdog
        re-reads it). Source topics may hold transaction markers from producers outside the grader:
        there a hole is an offset that was fetched and not acknowledged (`committable`)."""
        acked = self._acked[tp]
        if not acked:
            return None
        committed = self._committed_offset[tp]
        if tp.topic.endswith("-join"):
            if committed is not None and min(acked) > committed:
                return None
            return super()._new_offset(tp)  # type: ignore[no-any-return]
        acked.sort()
        fetched = self._fetched.get(tp, set())
        if committed and fetched:
            fetched.difference_update([o for o in fetched if o < committed])
        taken, offset = committable(acked, committed, fetched)
        if taken:
            self._acked_index[tp].difference_update(acked[:taken])
            del acked[:taken]
        return offset

    async def seek_to_committed(self) -> Mapping[Any, int]:
        committed = await super().seek_to_committed()
        rewound = []
        for tp, offset in committed.items():
            if not offset and not tp.topic.endswith("-changelog"):
                await self.seek(TP(tp.topic, tp.partition), 0)
                rewound.append(f"{tp.topic}/{tp.partition}")
        log.info("stream positions set from the committed offsets",
                 extra={"committed": {f"{tp.topic}/{tp.partition}": o for tp, o in committed.items()
                                      if not tp.topic.endswith("-changelog")}, "rewound": rewound})
        return committed


faust_aiokafka.Transport.Producer = _IdempotentProducer
faust_aiokafka.Transport.Consumer = _LosslessConsumer


class _Item(NamedTuple):
    """One join item of a grade batch, with the join record it came in (the unit the grade stage retries,
    splits and, as a last resort, dead-letters)."""

    ev: EventT
    key: bytes
    value: bytes
    error: str = ""
    """Why the join record could not be read as a bundle ("" = a readable item)."""


def _items(events: Sequence[EventT]) -> list[_Item]:
    out = []
    for ev in events:
        try:
            out += [_Item(ev, key, value) for key, value in decode_bundle(ev.value)]  # type: ignore[arg-type]
        except BadJoinRecord as e:
            out.append(_Item(ev, b"", b"", str(e)))
    return out


def _brokers(bootstrap: str) -> list[str]:
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


class GraderApp:
    def __init__(self, settings: GraderSettings, config: GraderConfig, *,
                 judge: JudgeBackend | None = None) -> None:
        self.settings = settings
        self.config = config
        topics = settings.common.topics
        self.stats = DetectorStats(config.detectors)
        self.joiner = Joiner(config, self.stats, retention_s=settings.retention_s,
                             orphan_feedback_s=settings.orphan_feedback_s, source=SOURCE, limits=limits_of(settings))
        self.judge = judge
        self._seq = 0
        self._due: dict[bytes, tuple[float, bool, int]] = {}
        """key -> (next time the ticker must look at it, window still open, partition)."""
        self._judge_due: dict[bytes, float] = {}
        self._settled: set[int] = set()
        """Join partitions whose in-doubt emissions have been settled since this worker got them."""
        self._lock = asyncio.Lock()
        self._stalls = StallTracker(settings.stall_after_s)
        self._stall_check_at = 0.0
        point, _, count = settings.fault_injection.partition(":")
        self._fault = (point, int(count)) if point else None
        self._emitting_batches = 0

        settings.datadir.mkdir(parents=True, exist_ok=True)
        P = settings.partitions
        self.app = faust.App(
            settings.app_id, broker=_brokers(settings.common.kafka_bootstrap), store=settings.store,
            broker_credentials=faust_credentials(settings.common),  # TLS / SASL, as every Kafka client
            datadir=str(settings.datadir / settings.app_id), web_enabled=False, autodiscover=False,
            topic_partitions=P, topic_replication_factor=settings.replication,
            key_serializer="raw", value_serializer="raw", consumer_auto_offset_reset="earliest",
            consumer_max_fetch_size=4 * 1024 * 1024, stream_buffer_maxsize=max(4096, 4 * settings.batch_max),
            broker_commit_every=max(1000, settings.batch_max), broker_commit_interval=settings.commit_interval_s,
            producer_acks=-1, producer_linger=0.005, table_standby_replicas=0,
            broker_session_timeout=settings.session_timeout_s,
            broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 4),
            broker_max_poll_interval=settings.max_poll_interval_s,
            consumer_group_instance_id=settings.instance_id or None)
        app = self.app
        raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                               "value_serializer": "raw"}
        self.source_topic = app.topic(topics.interactions, topics.feedback, **raw)
        self.join_topic = app.topic(settings.join_topic, partitions=P, internal=True, **raw)
        self.judge_topic = app.topic(settings.judge_topic, partitions=P, internal=True, **raw)
        self.topic_names = {"interactions": topics.interactions, "feedback": topics.feedback,
                            "graded": topics.graded, "deadletter": topics.deadletter}
        # Keys and values are raw bytes (the app's serializers): states are encoded by state.py.
        self.table = app.Table("pending", partitions=P, key_type=bytes, value_type=bytes)
        self.judge_table = app.Table("judge-groups", partitions=P, key_type=bytes, value_type=bytes)
        app.on_partitions_revoked.connect(self._on_partitions_revoked)  # type: ignore[arg-type]
        app.agent(self.source_topic, name="route")(self._route_agent)
        app.agent(self.join_topic, name="grade")(self._grade_agent)
        app.agent(self.judge_topic, name="judge")(self._judge_agent)
        app.task(self._ticker)

    # --- helpers ---------------------------------------------------------------------------------
    async def _send(self, topic: str, key: bytes | None, value: bytes | None,
                    partition: int | None = None, headers: KafkaHeaders | None = None) -> Awaitable[Any]:
        """Hand a record to the producer; the returned future resolves when Kafka acknowledged it.
        `headers`: the value's type (shared/validation.py) on the graded and dead-letter topics."""
        return await self.app.producer.send(topic, key, value, partition, None, headers)  # type: ignore[arg-type]  # bytes values

    async def _dead_letter(self, ev: EventT, stage: str, reason: str, error_type: str,
                           tenant: str = "unknown", *, key: bytes | None = None,
                           value: bytes | None = None) -> Awaitable[Any]:
        """DeadLetter for `ev` (or for one item `key`/`value` of a join bundle), tagged with the stage."""
        msg = ev.message
        key = ev.key if key is None else key
        value = ev.value if value is None else value
        dl = dead_letter(Rejected(stage, reason, error_type, tenant), source=SOURCE, topic=msg.topic,
                         partition=msg.partition, offset=msg.offset, key=key, value=value)
        M.DEADLETTERS.labels(stage).inc()
        log.warning("dead-lettered record", extra={"stage": stage, "reason": reason[:300],
                                                    "origin": f"{msg.topic}/{msg.partition}@{msg.offset}"})
        return await self._send(self.topic_names["deadletter"], dl.original_key or None, dl.SerializeToString(),
                                headers=DEADLETTER_HEADERS)

    async def _poison_event(self, ev: EventT, failure: Failure) -> None:
        """A source record that every batch holding it failed on (poison.py): dead-lettered on its own."""
        await (await self._dead_letter(ev, POISON_STAGE, f"every batch holding this record failed the same way: "
                                                         f"{failure.signature}", "PoisonRecord"))

    async def _poison_item(self, item: _Item, failure: Failure) -> None:
        """One join item that every batch holding it failed on: dead-lettered on its own."""
        await (await self._dead_letter(item.ev, POISON_STAGE, f"every batch holding this join item failed the "
                                                              f"same way: {failure.signature}", "PoisonRecord",
                                       key=item.key or None, value=item.value or None))

    def _changelog_name(self, table: Any) -> str:
        return str(table.changelog_topic.get_topic_name())

    # --- stage 1: route -----------------------------------------------------------------------------
    async def _route_agent(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_max, within=self.settings.batch_within_s):
            await run_bisecting(list(events), self._route_batch, poison=self._poison_event, stage="route")

    async def _route_batch(self, events: Sequence[EventT]) -> None:
        join_items: dict[int, list[tuple[bytes, bytes]]] = {}
        judge_items: list[tuple[bytes, bytes]] = []
        futs: list[Awaitable[Any]] = []
        for ev in events:
            dead = await self._route_one(ev, join_items, judge_items)
            if dead is not None:
                futs.append(dead)
        futs.extend(await self._send_bundles(self.settings.join_topic, join_items))
        for key, value in judge_items:
            futs.append(await self._send(self.settings.judge_topic, key, value))
        if futs:
            await asyncio.gather(*futs)

    # Each agent batch runs under poison.run_bisecting, never raising. No exception may reach faust's
    # agent supervisor: it restarts the agent, but the batch in hand is gone (taken from the stream,
    # never delivered to this worker again, while later records are processed and committed), so its
    # records would be lost: the intermittent loss of a batch's records once seen in
    # tests/integration/test_grader_restart.py, reproduced by making `settle`'s look-up in the graded topic fail once, as a Kafka call timing
    # out under load does. Retrying is safe: routing is idempotent downstream, and a grade batch that
    # failed is settled again before it is applied again. A batch that fails the same way twice because
    # of one record is split until that record is found and dead-lettered (a record the broker refuses
    # once stopped the grader for good); cancellation (shutdown) passes through every await.

    async def _send_bundles(self, topic: str, items: dict[int, list[tuple[bytes, bytes]]]) -> list[Awaitable[Any]]:
        limit = self.joiner.limits.max_record_bytes
        return [await self._send(topic, None, bundle, p) for p, batch in sorted(items.items())
                for bundle in encode_bundles(batch, limit)]

    def _add_join_item(self, items: dict[int, list[tuple[bytes, bytes]]], key: bytes, value: bytes) -> None:
        items.setdefault(partition_for(key, self.settings.partitions), []).append((key, value))

    async def _route_one(self, ev: EventT, join_items: dict[int, list[tuple[bytes, bytes]]],
                         judge_items: list[tuple[bytes, bytes]]) -> Awaitable[Any] | None:
        """Validate one source record and queue its join item; a dead letter's future when rejected."""
        r = route(ev.message.topic == self.topic_names["interactions"], ev.value, self.joiner.task_of,
                  ev.message.headers, limits=self.joiner.limits)
        if r.rejected is not None:
            return await self._dead_letter(ev, r.rejected.stage, r.rejected.reason, r.rejected.error_type,
                                           r.rejected.tenant)
        if r.join is not None:
            self._add_join_item(join_items, *r.join)
        if r.judge is not None:
            judge_items.append(r.judge)
        return None

    # --- stage 2: grade (owns the table) -------------------------------------------------------------
    async def _grade_agent(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_max, within=self.settings.batch_within_s):
            start = time.perf_counter()
            parts = {ev.message.partition for ev in events}
            # A failed batch may have left emissions in doubt: settle its partitions again before the retry.
            await run_bisecting(_items(events), self.grade_batch, poison=self._poison_item, stage="grade",
                                on_error=functools.partial(self._settled.difference_update, parts))
            M.BATCH_SECONDS.observe(time.perf_counter() - start)

    def _next_seq(self) -> int:
        # Milliseconds keep sequences increasing across restarts; max() keeps them above recovered ones.
        self._seq = max(self._seq + 1, int(time.time() * 1000))
        return self._seq

    async def grade_batch(self, items: Sequence[_Item]) -> None:
        # The lock orders this batch with a settle started by the ticker (both touch the table).
        async with self._lock:
            unsettled = {item.ev.message.partition for item in items} - self._settled
            if unsettled:
                await self.settle(unsettled)
                self._settled |= unsettled
            await self._grade_batch(items)

    async def _grade_batch(self, items: Sequence[_Item]) -> None:
        now = time.time()
        seq = self._next_seq()
        data = self.table.data
        current: dict[bytes, bytes | None] = {}
        partition_of: dict[bytes, int] = {}
        dirty: list[bytes] = []
        emits: list[tuple[events_pb2.GradedInteraction, int]] = []
        dead: list[Awaitable[Any]] = []
        for ev, key, value, error in items:
            p = ev.message.partition
            if error:  # the join record is not a bundle
                dead.append(await self._dead_letter(ev, "grader.join", error, BadJoinRecord.__name__))
                continue
            raw = current[key] if key in current else data.get(key)
            try:
                state = PendingState.decode(raw) if raw is not None else None
            except ValueError as e:
                step: Step | Rejected = Rejected("grader.join", f"unreadable state: {e}", type(e).__name__)
            else:
                step = self.joiner.apply_guarded(state, key, value, now, p)
            blob: bytes | None = None
            if not isinstance(step, Rejected):
                if step.emit is not None and step.state is not None:  # the emission marker goes with the state
                    step.state.pending_seq, step.state.pending_ts = seq, now
                blob = step.state.encode() if step.changed and step.state is not None else None
                too_big = oversize(len(blob or b""), step.emit, self.joiner.limits)
                if too_big is not None:
                    step = Rejected(too_big.stage, too_big.reason, "Refused")
            if isinstance(step, Rejected):
                dead.append(await self._dead_letter(ev, step.stage, step.reason, step.error_type,
                                                    step.tenant, key=key, value=letter_value(step, value)))
                continue
            for body, why in step.refused:
                dead.append(await self._dead_letter(ev, why.stage, why.reason, why.error_type, why.tenant,
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
                self._due.pop(key, None)
            else:
                due, open_ = self.joiner.due(step.state)
                self._due[key] = (due, open_, p)

        # (a) states, with their emission markers, durable before any record leaves; the table takes
        # them only then, so that a batch that fails here is applied again from the states before it
        changelog = self._changelog_name(self.table)
        futs = [await self._send(changelog, key, current[key], partition_of[key]) for key in dirty]
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
        graded = self.topic_names["graded"]
        futs = [await self._send(graded, rec.interaction.session_id.encode() or None, rec.SerializeToString(),
                                 headers=GRADED_HEADERS) for rec, _ in emits]
        if futs:
            await asyncio.gather(*futs)
        if emits:
            self._maybe_crash("after_emit")
        # (c) confirm: every emission of this batch is in the graded topic
        for p in sorted({p for _, p in emits}):
            k, v = seq_key(p).encode(), encode_seq(seq)
            data[k] = v
            dead.append(await self._send(changelog, k, v, p))
        if dead:
            await asyncio.gather(*dead)
        for rec, _ in emits:
            M.count_emitted(rec)
        log.debug("join batch done", extra={"items": len(items), "states": len(dirty), "emitted": len(emits)})

    async def _unstall(self, now: float) -> None:
        """Resume and seek back to their committed offset the source and join partitions whose commit
        stopped short of their end (stall.py says why this is needed and safe)."""
        streams = {self.topic_names["interactions"], self.topic_names["feedback"], self.settings.join_topic}
        tps = [tp for tp in self.app.assignor.assigned_actives() if tp.topic in streams]
        if not tps:
            return
        consumer = self.app.consumer
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

    def _maybe_crash(self, point: str) -> None:
        if self._fault is not None and self._fault == (point, self._emitting_batches):
            log.warning("fault injection: exiting abruptly", extra={"point": point})
            os._exit(137)

    # --- recovery -----------------------------------------------------------------------------------
    def _active_partitions(self, topic: str) -> set[int]:
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic}

    async def _on_partitions_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        """(faust signal receiver) A partition that leaves this worker must be settled again if it ever comes back: another
        worker may have crashed with emissions in doubt on it meanwhile."""
        gone = {tp.partition for tp in revoked if tp.topic == self.settings.join_topic}
        self._settled -= gone
        for key in [k for k, (_d, _o, p) in self._due.items() if p in gone]:
            del self._due[key]

    async def settle(self, parts: set[int]) -> None:
        """Before the first record of a partition this worker (newly) owns: find the states whose last
        emission is in doubt (pending_seq > the partition's confirmed sequence), look for their records
        in the graded topic, emit the missing ones, confirm; and index the partition's due times.

        Runs inside the grade agent, so it sees the table fully restored (faust resumes a stream
        partition only after its table partition is recovered) and before any record of `parts`."""
        data = self.table.data
        changelog = self._changelog_name(self.table)
        confirmed = {p: decode_seq(data.get(seq_key(p).encode())) for p in parts}
        self._seq = max([self._seq, *confirmed.values()])
        in_doubt: list[PendingState] = []
        for key, raw in list(data.items()):
            if key.startswith(SEQ_KEY_PREFIX.encode()) or raw is None:
                continue
            st = PendingState.decode(raw)
            self._seq = max(self._seq, st.pending_seq)
            if st.partition not in parts:
                continue
            due, open_ = self.joiner.due(st)
            self._due[key] = (due, open_, st.partition)
            if st.revision > 0 and st.pending_seq > confirmed[st.partition]:
                in_doubt.append(st)
        if not in_doubt:
            return
        wanted = {graded_event_id(st.interaction_id, st.revision): st for st in in_doubt}
        since = min(st.pending_ts for st in in_doubt) - self.settings.verify_margin_s

        found = await asyncio.to_thread(find_event_ids, self.settings.common.kafka_bootstrap,
                                        self.topic_names["graded"], set(wanted), since)
        now = time.time()
        sent: list[tuple[events_pb2.GradedInteraction, Awaitable[Any]]] = []
        for event_id, st in wanted.items():
            if event_id in found:
                M.RECOVERED.labels("already_emitted").inc()
                continue
            rec = self.joiner.rebuild(st, now)
            if rec is None:
                continue
            sent.append((rec, self._send(self.topic_names["graded"], rec.interaction.session_id.encode() or None,
                                         rec.SerializeToString(), headers=GRADED_HEADERS)))
        for rec, sending in sent:
            try:
                await (await sending)
            except Exception as e:  # noqa: BLE001 - sorted below: the broker refusing this record, or not
                if not classify(e).record_caused:
                    raise  # the batch is retried (and settles again)
                # The broker refuses this record (e.g. a topic limit below the grader's): dead-lettered,
                # as a poison record is, so that the partition is not held in doubt for good.
                letter = dead_letter(Rejected(POISON_STAGE, f"graded record refused by Kafka: {e}", type(e).__name__,
                                              rec.envelope.tenant), source=SOURCE, topic=self.topic_names["graded"],
                                     partition=-1, offset=-1, key=rec.interaction.session_id.encode(),
                                     value=rec.SerializeToString())
                await (await self._send(self.topic_names["deadletter"], letter.original_key or None,
                                        letter.SerializeToString(), headers=DEADLETTER_HEADERS))
                M.DEADLETTERS.labels(POISON_STAGE).inc()
                log.error("a graded record the broker refuses was dead-lettered",
                          extra={"interaction_id": rec.interaction.interaction_id, "error": str(e)[:300]})
                continue
            M.RECOVERED.labels("re_emitted").inc()
            M.count_emitted(rec)
        seq = self._next_seq()
        futs = []
        for p in sorted({st.partition for st in in_doubt}):
            k, v = seq_key(p).encode(), encode_seq(seq)
            data[k] = v
            futs.append(await self._send(changelog, k, v, p))
        await asyncio.gather(*futs)
        log.info("settled in-doubt emissions after recovery",
                 extra={"in_doubt": len(in_doubt), "already_emitted": len(found & set(wanted)),
                        "partitions": sorted(parts)})

    # --- stage 3: judge (groups by group id) ---------------------------------------------------------
    async def _judge_agent(self, stream: Any) -> None:
        async for ev in stream.events():
            try:
                await self._judge_event(ev)
            except Exception as e:  # noqa: BLE001 - the judge stage must keep going
                log.exception("judge stage failed")
                await (await self._dead_letter(ev, "grader.judge", f"{type(e).__name__}: {e}", type(e).__name__))

    async def _judge_event(self, ev: EventT) -> None:
        key: bytes = ev.key or b""  # type: ignore[assignment]  # raw serializer: bytes
        value: bytes = ev.value or b""  # type: ignore[assignment]
        raw = self.judge_table.get(key)
        group = JudgeGroup.decode(raw) if raw else None
        if value[:1] == TICK:
            if group is not None:
                await self._judge_members(group.interactions())
                del self.judge_table[key]
            self._judge_due.pop(key, None)
            return
        it = events_pb2.Interaction.FromString(value[1:])
        task = self.joiner.task_for(it)
        step = add_member(group, it, value[1:], task, time.time())
        if step.ready:
            await self._judge_members(step.ready)
        if step.changed:
            if step.group is None:
                del self.judge_table[key]
            else:
                self.judge_table[key] = step.group.encode()
        if step.group is None:
            self._judge_due.pop(key, None)
        else:
            self._judge_due[key] = judge_due(step.group, task)

    async def _judge_members(self, members: list[events_pb2.Interaction]) -> None:
        """One judge call per judge grader for the group; results go to the join topic."""
        task = self.joiner.task_for(members[0])
        if task is None:
            return
        if self.judge is None:
            self.judge = make_judge_backend(self.settings.judge_backend, endpoint=self.settings.inference_endpoint,
                                            tenant=self.settings.judge_tenant)
        items: dict[int, list[tuple[bytes, bytes]]] = {}
        for spec in task.judges:
            for key, value in judge_items(spec, await judge_group(self.judge, spec, members)):
                self._add_join_item(items, key, value)
        futs = await self._send_bundles(self.settings.join_topic, items)
        if futs:
            await asyncio.gather(*futs)

    # --- ticker -------------------------------------------------------------------------------------
    async def _ticker(self) -> None:
        """Windows and retention are wall-clock timers: due keys get a tick record on the join topic,
        so that every state change still happens inside the grade agent, in partition order."""
        interval = self.settings.tick_interval_s
        while not self.app.should_stop:
            await asyncio.sleep(interval)
            try:
                await self.tick(time.time())
            except Exception:  # noqa: BLE001 - a failed tick is retried next interval
                log.exception("tick failed")

    async def tick(self, now: float) -> None:
        active = self._active_partitions(self.settings.join_topic)
        recovered = self.app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]
        if active - self._settled and not self.app.rebalancing and recovered:
            # A partition with no new records since this worker got it still has windows to close.
            async with self._lock:
                unsettled = self._active_partitions(self.settings.join_topic) - self._settled
                if unsettled:
                    await self.settle(unsettled)
                    self._settled |= unsettled
        if recovered and not self.app.rebalancing and now >= self._stall_check_at:
            self._stall_check_at = now + min(5.0, self.settings.stall_after_s / 2)
            try:
                await self._unstall(now)
            except Exception:  # noqa: BLE001 - a failed check must not hold back the timers below
                log.exception("stall check failed")
        ticks: dict[int, list[tuple[bytes, bytes]]] = {}
        open_count = 0
        for key, (due, open_, p) in list(self._due.items()):
            open_count += open_
            if due <= now and p in active:
                ticks.setdefault(p, []).append((key, TICK))
                self._due[key] = (now + TICK_RETRY_S, open_, p)
        futs = await self._send_bundles(self.settings.join_topic, ticks)
        judge_active = self._active_partitions(self.settings.judge_topic)
        for key, due in list(self._judge_due.items()):
            if due <= now:
                futs.append(await self._send(self.settings.judge_topic, key, TICK))
                self._judge_due[key] = now + TICK_RETRY_S
        if not self._judge_due and judge_active:
            # After a restart the in-memory due list is empty: rebuild it from the (small) judge table.
            for key, raw in list(self.judge_table.data.items()):
                if raw is not None:
                    group = JudgeGroup.decode(raw)
                    first = group.interactions()[:1]
                    self._judge_due[key] = judge_due(group, self.joiner.task_for(first[0]) if first else None)
        if futs:
            await asyncio.gather(*futs)
        M.PENDING.set(open_count)
        M.export_stats(self.stats)


def find_event_ids(bootstrap: str, topic: str, wanted: set[str], since: float,
                   timeout: float = 30.0) -> set[str]:
    """Which of `wanted` event ids are in `topic` at or after wall-clock time `since` (all partitions)."""
    c = Consumer({**librdkafka_config(), **client_log_config(bootstrap), "bootstrap.servers": bootstrap, "group.id": f"grader-verify-{uuid.uuid4()}",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    found: set[str] = set()
    try:
        md = c.list_topics(topic, timeout=timeout)
        parts = list(md.topics[topic].partitions)
        starts = c.offsets_for_times([TopicPartition(topic, p, max(0, int(since * 1000))) for p in parts],
                                     timeout=timeout)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in parts}
        assign = [tp for tp in starts if tp.offset >= 0 and tp.offset < ends[tp.partition]]
        if not assign:
            return found
        c.assign(assign)
        remaining = {tp.partition for tp in assign}
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    continue
                try:
                    eid = events_pb2.GradedInteraction.FromString(m.value()).envelope.event_id
                except Exception:  # noqa: BLE001 - a foreign record is simply not ours
                    eid = ""
                if eid in wanted:
                    found.add(eid)
                if (m.offset() or 0) + 1 >= ends[m.partition() or 0]:
                    remaining.discard(m.partition())
        if remaining:
            raise TimeoutError(f"could not read {topic} partitions {sorted(remaining)} to their end")
    finally:
        c.close()
    return found



class FaustRuntime(GraderRuntime):
    """The faust app run by a faust Worker (signals, logging and the event loop are faust's)."""

    def __init__(self, settings: GraderSettings, config: GraderConfig) -> None:
        self.settings = settings
        self.grader = GraderApp(settings, config)

    def run(self) -> int:
        # The internal topics exist before faust subscribes: created by faust itself while it starts, the
        # join topic was sometimes missing from the first assignment ("Ignoring missing topic"), and
        # this worker then graded nothing until some later rebalance.
        ensure_internal_topics(self.settings)
        worker = faust.Worker(self.grader.app, loglevel=self.settings.log_level, quiet=True,
                              redirect_stdouts=False, override_logging=False)
        try:
            worker.execute_from_commandline()
        except SystemExit as e:
            return int(e.code or 0)
        return 0
