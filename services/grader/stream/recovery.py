"""faust runtime: emission markers --> in-doubt emissions settled after a crash or a rebalance.

Each grade batch (grade.py) writes its changed states to the changelog before it sends their
graded records; a state that emits carries `pending_seq` (the batch's sequence) and `pending_ts`, and
after the records are acknowledged the batch writes `__confirmed__/<partition> = seq`. A restored state
with `pending_seq` above its partition's confirmed sequence was emitted between those two writes, or
not at all: it is in doubt. Before the grade agent applies anything to a join partition this worker
(newly) owns, `settle` looks for each in-doubt record's deterministic event id in the graded topic
(event_scan.py), emits the missing ones, and confirms. services/grader/README.md, "Exactly-once
effect", has the whole argument.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Collection
from typing import Any

from services.grader import metrics as M
from services.grader.core.join import Rejected, graded_event_id
from services.grader.core.poison import POISON_STAGE, classify
from services.grader.core.routing import DEADLETTER_HEADERS, GRADED_HEADERS, dead_letter
from services.grader.core.state import SEQ_KEY_PREFIX, PendingState, decode_seq, encode_seq, seq_key
from services.grader.stream.context import StageContext
from services.grader.stream.event_scan import find_event_ids
from shared.kafka.trust import RecordTrust
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)


class EmissionRecovery:
    """The batch sequences, which join partitions are settled, and the lock that orders a settle with
    grade batches (both touch the table)."""

    def __init__(self, g: StageContext) -> None:
        self.g = g
        self.seq = 0
        self.settled: set[int] = set()
        """Join partitions whose in-doubt emissions have been settled since this worker got them."""
        self.lock = asyncio.Lock()

    def next_seq(self) -> int:
        # Milliseconds keep sequences increasing across restarts; max() keeps them above recovered ones.
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        return self.seq

    def forget(self, parts: Collection[int]) -> None:
        """`parts` must be settled again before their next batch (revoked, or a batch on them failed)."""
        self.settled.difference_update(parts)

    async def settle_new(self, parts: Collection[int]) -> None:
        """Settle those of `parts` not settled yet. The caller holds `lock`."""
        unsettled = set(parts) - self.settled
        if unsettled:
            await self.settle(unsettled)
            self.settled |= unsettled

    async def settle(self, parts: set[int]) -> None:
        """Before the first record of a partition this worker (newly) owns: find the states whose last
        emission is in doubt (pending_seq > the partition's confirmed sequence), look for their records
        in the graded topic, emit the missing ones, confirm; and index the partition's due times.

        Runs inside the grade agent, so it sees the table fully restored (faust resumes a stream
        partition only after its table partition is recovered) and before any record of `parts`."""
        g = self.g
        data = g.table.data
        changelog = g.changelog_name(g.table)
        confirmed = {p: decode_seq(data.get(seq_key(p).encode())) for p in parts}
        self.seq = max([self.seq, *confirmed.values()])
        in_doubt: list[PendingState] = []
        for key, raw in list(data.items()):
            if key.startswith(SEQ_KEY_PREFIX.encode()) or raw is None:
                continue
            try:
                st = PendingState.decode(raw)
            except ValueError as e:  # the grade stage dead-letters the next item that meets it
                log.error("unreadable state in the pending table; not settled",
                          extra={"key": key[:80].decode(errors="replace"), "error": str(e)[:200]})
                continue
            self.seq = max(self.seq, st.pending_seq)
            if st.partition not in parts:
                continue
            due, open_ = g.joiner.due(st)
            g.due[key] = (due, open_, st.partition)
            g.waiting.update(key.decode(errors="replace"), st, open_)
            if st.revision > 0 and st.pending_seq > confirmed[st.partition]:
                in_doubt.append(st)
        if not in_doubt:
            return
        wanted = {graded_event_id(st.interaction_id, st.revision): st for st in in_doubt}
        since = min(st.pending_ts for st in in_doubt) - g.settings.verify_margin_s

        # a fresh check (no replay memory shared with the source topics): a re-read finds the same records
        found = await asyncio.to_thread(find_event_ids, g.settings.common.kafka_bootstrap,
                                        g.topic_names["graded"], set(wanted), since,
                                        trust=RecordTrust.from_settings(g.settings.common))
        now = time.time()
        sent: list[tuple[events_pb2.GradedInteraction, Awaitable[Any]]] = []
        for event_id, st in wanted.items():
            if event_id in found:
                M.RECOVERED.labels("already_emitted").inc()
                continue
            rec = g.joiner.rebuild(st, now)
            if rec is None:
                continue
            sent.append((rec, g.send(g.topic_names["graded"], rec.interaction.session_id.encode() or None,
                                     rec.SerializeToString(), headers=GRADED_HEADERS)))
        for rec, sending in sent:
            try:
                await (await sending)
            except Exception as e:  # noqa: BLE001 - sorted below: the broker refusing this record, or not
                if not classify(e).record_caused:
                    raise  # the batch is retried (and settles again)
                await self._dead_letter_refused(rec, e)
                continue
            M.RECOVERED.labels("re_emitted").inc()
            M.count_emitted(rec)
        seq = self.next_seq()
        futs = []
        for p in sorted({st.partition for st in in_doubt}):
            k, v = seq_key(p).encode(), encode_seq(seq)
            data[k] = v
            futs.append(await g.send(changelog, k, v, p))
        await asyncio.gather(*futs)
        log.info("settled in-doubt emissions after recovery",
                 extra={"in_doubt": len(in_doubt), "already_emitted": len(found & set(wanted)),
                        "partitions": sorted(parts)})

    async def _dead_letter_refused(self, rec: events_pb2.GradedInteraction, e: Exception) -> None:
        """The broker refuses this graded record (e.g. a topic limit below the grader's): dead-lettered,
        as a poison record is, so that the partition is not held in doubt for good."""
        g = self.g
        letter = dead_letter(Rejected(POISON_STAGE, f"graded record refused by Kafka: {e}", type(e).__name__,
                                      rec.envelope.tenant), source="grader", topic=g.topic_names["graded"],
                             partition=-1, offset=-1, key=rec.interaction.session_id.encode(),
                             value=rec.SerializeToString())
        await (await g.send(g.topic_names["deadletter"], letter.original_key or None,
                            letter.SerializeToString(), headers=DEADLETTER_HEADERS))
        M.DEADLETTERS.labels(POISON_STAGE).inc()
        log.error("a graded record the broker refuses was dead-lettered",
                  extra={"interaction_id": rec.interaction.interaction_id, "error": str(e)[:300]})
