"""faust-streaming's aiokafka transport, minus the ways it loses or duplicates the grader's records.

Every workaround of faust internals the grader needs is here, and nowhere else. `install()` swaps the
two classes into faust's aiokafka `Transport` (app.py calls it when it is imported, before any faust
app exists). Each workaround overrides a private faust method or attribute; tests/unit/grader/
test_faust_patches.py pins what each one relies on in the installed faust version (the method exists
with this signature, the unpatched behaviour is still the one repaired), so an upgrade that changes
it fails there first. Each item below was reproduced by tests/integration/test_grader_restart.py or
test_grader_stream.py before its fix existed.

Producer (`IdempotentProducer`):
  P1. `enable_idempotence`: faust sets it only under its own exactly_once mode, which the grader does not
      use (its transactions cover only sends to the app's source topics). With it the broker drops a
      retried batch it already has, so a producer retry never writes a graded record twice.
  P2. Rewind the sequence after a refused batch (`SequenceRewindingHandler`, aiokafka itself): an
      idempotent aiokafka producer numbers each partition's batches when it sends them and never takes
      a number back. When the broker refuses a batch outright (a record over the topic's
      `max.message.bytes`), the broker's expected sequence stays where it was and the producer's has
      moved past it, so every later batch to that partition fails with OutOfOrderSequenceNumber until
      the process restarts: one refused graded record stopped grading on its partition for good. The
      Java client takes the refused batch's numbers back (`adjustSequencesDueToFailedBatch`); so does
      this. It is safe because aiokafka sends one batch per partition at a time (the partition is
      muted while a request is in flight), so no later batch holds a number yet, and because only the
      errors with which the broker answers "not appended" are rewound.

Consumer (`LosslessConsumer`, with `ReadCommittedThread`):
  C1. read_committed: faust reads read_committed only under exactly_once. The grader's former native
      runtime wrote the join topic and the table changelogs in transactions; in a deployment that ran
      it, the records of its aborted batches are still in those logs and must not become state here.
  C2. Rewind partitions without a committed offset: after recovery faust seeks stream partitions "to
      their committed offset", but aiokafka skips the seek for a partition that has none, leaving the
      position after records faust fetched and then dropped from its queues while recovering. Such
      partitions are sought to their beginning (auto_offset_reset is earliest).
  C3. Never drop a re-delivered record: faust drops a fetched record whose offset is below the
      partition's last *read* offset. A seek during start-up (faust seeks twice) followed by a stale
      pre-seek batch moves that read offset past records that were never delivered, and their re-fetch
      is dropped. Here the read-offset map never remembers (`_NoReadOffsets`): a re-delivered record is
      replayed, and the join state machine de-duplicates it by event id.
  C4. No "gaps": faust counts the offsets it skipped between two fetched records (transaction markers,
      compaction, but also records lost as in C3) as acknowledged, so the commit moves past lost
      records. Here `_add_gap` does nothing and the commit decides from what was *fetched*
      (commit_offsets.py): a never-fetched offset is committed over, a fetched one is waited for.
  C5. No commit over one unacknowledged record: `_new_offset`'s hole check is
      `min(acked) - committed > 1`, while `committed` already is the next offset to read, so with 12,
      13, 14 acknowledged and 11 not it commits 15 and 11 is never processed (with no commit yet, or one
      at 0, it checks nothing). On the join topic (only the grader writes it, without transactions:
      contiguous offsets) any unacknowledged offset below an acknowledged one is a hole and holds the
      commit until it fills (the stall watchdog, stall.py, re-reads it); on the source topics a hole is
      an offset that was fetched and not acknowledged (`committable`).
  C6. A commit that a rebalance raced does not crash the worker: faust's consumer keeps, of the offsets
      to commit, those of partitions assigned at that moment, then awaits a producer flush, then hands
      them to its consumer thread, which filters them by the assignment again and commits. A rebalance
      during the flush leaves the thread nothing to commit while aiokafka holds no assignment, and
      aiokafka's commit of nothing then raises IllegalStateError ("No partitions assigned"), on which
      faust crashes the whole worker (it spares only CommitFailedError's "already rebalanced"). Here a
      commit left with nothing of this worker's is skipped, and so is one that fails because a rebalance
      took a partition away, because the group rebalanced under it, or with a timeout or another error
      aiokafka calls retriable: what it would have covered is re-read after a restart or by the
      partition's next owner, and the join state machine ignores what it already applied. A commit that
      keeps failing for `COMMIT_FAILURE_LIMIT_S`, or fails in any other way (an authorization error),
      still crashes the worker, so its supervisor restarts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from aiokafka import errors as aiokafka_errors
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import OffsetAndMetadata
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from services.grader.stream.commit_offsets import committable

log = logging.getLogger(__name__)

JOIN_SUFFIX = "-join"
"""Internal join topics end so (settings.py `join_topic`): contiguous offsets, written only by the grader."""


class IdempotentProducer(faust_aiokafka.Producer):
    """P1: `acks=all` + `enable_idempotence`, whether or not faust runs exactly_once."""

    def _settings_extra(self) -> dict[str, Any]:
        return {"acks": "all", "enable_idempotence": True}


REFUSED_NOT_APPENDED: tuple[type[BaseException], ...] = (
    aiokafka_errors.MessageSizeTooLargeError, aiokafka_errors.RecordListTooLargeError,
    aiokafka_errors.InvalidMessageError, aiokafka_errors.CorruptRecordException,
    aiokafka_errors.InvalidTimestampError,
)
"""P2: partition errors of a produce response with which the broker refuses the whole batch unwritten."""


class SequenceRewindingHandler(aiokafka_sender.SendProduceReqHandler):  # type: ignore[misc]
    """P2: after a produce response, take back the sequence numbers of a batch the broker refused."""

    def handle_response(self, response: Any) -> None:
        super().handle_response(response)
        rewind_refused(self._sender._txn_manager, self._batches)


def rewind_refused(txn: Any, batches: Mapping[Any, Any]) -> list[Any]:
    """P2's step, over the batches of one answered produce request (partition -> aiokafka MessageBatch):
    for each the broker refused unwritten, set the partition's next sequence back to the batch's first,
    which is the one the broker still expects. Returns the partitions rewound.

    Only an idempotent, non-transactional producer (`txn` without transactional id; None = neither):
    in a transaction the failed batch aborts it. A refused batch whose numbers are not the partition's
    last is left alone (it cannot happen with one batch in flight per partition; were it to, rewinding
    would hand a later batch's numbers out twice)."""
    if txn is None or txn.transactional_id is not None:
        return []
    rewound = []
    for tp, batch in batches.items():
        fut = batch.future
        if not fut.done() or fut.cancelled() or not isinstance(fut.exception(), REFUSED_NOT_APPENDED):
            continue
        base = _base_sequence(batch)
        count = batch.record_count
        expected = txn.sequence_number(tp)
        if base is None or (base + count) % 2**32 != expected % 2**32:
            log.warning("a refused batch's sequence is not the partition's last; not rewound",
                        extra={"partition": f"{tp.topic}/{tp.partition}", "base": base, "next": expected})
            continue
        txn.increment_sequence_number(tp, base - expected)  # back to `base`, across a wrap too
        rewound.append(tp)
        log.info("a batch the broker refused gave its sequence back",
                 extra={"partition": f"{tp.topic}/{tp.partition}", "records": count,
                        "error": type(fut.exception()).__name__})
    return rewound


def _base_sequence(batch: Any) -> int | None:
    """The first sequence number of a sent batch, from the bytes it was sent as (the builder that held
    it is gone once the batch is built)."""
    buffer = getattr(batch._builder, "_buffer", None)
    if buffer is None:
        return None
    return int(DefaultRecordBatch(bytes(buffer)).base_sequence)


class _NoReadOffsets(dict):  # type: ignore[type-arg]
    """C3: a read-offset map that never remembers (faust's drain loop reads it through `__getitem__`)."""

    def __getitem__(self, key: Any) -> None:
        return None


COMMIT_FAILURE_LIMIT_S = 120.0
"""C6: commits failing without a break for this long crash the worker (a restart gets new connections)."""


def commit_failure_passes(exc: BaseException, wanted: Collection[Any], assigned: Collection[Any]) -> bool:
    """C6: whether a failed commit of the partitions `wanted` (those faust found assigned) may be
    skipped, given the partitions `assigned` to this worker once it failed. It may when a rebalance took
    partitions away meanwhile (IllegalStateError with one of them no longer assigned), when the group
    rebalanced under it (CommitFailedError: aiokafka raises it only then), and on a timeout or another
    error aiokafka calls retriable; never on anything else."""
    if isinstance(exc, aiokafka_errors.CommitFailedError):
        return True
    if isinstance(exc, aiokafka_errors.IllegalStateError):
        return not set(wanted) <= set(assigned)
    if isinstance(exc, aiokafka_errors.KafkaTimeoutError | TimeoutError):
        return True
    return isinstance(exc, aiokafka_errors.KafkaError) and bool(exc.retriable)


class ReadCommittedThread(faust_aiokafka.AIOKafkaConsumerThread):
    """C1: the aiokafka consumer faust builds, reading read_committed. C6: its commits."""

    _commit_failing_since: float | None = None

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # read by AIOKafkaConsumer.start()
        return consumer

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        """C6: faust's commit (the same steps), minus the crash on a commit that a rebalance raced or a
        failure that passes. False: nothing was committed (faust commits again at its next interval)."""
        consumer = self._ensure_consumer()
        now = time.monotonic()
        mine = {tp: offset for tp, offset in offsets.items() if tp in self.assignment()}
        if offsets and not mine:
            log.info("a commit found none of its partitions assigned any more (a rebalance); skipped",
                     extra={"partitions": len(offsets)})
            return False
        try:
            self.tp_last_committed_at.update({tp: now for tp in mine})
            await consumer.commit({faust_aiokafka.ensure_aiokafka_TP(tp): OffsetAndMetadata(offset, "")
                                   for tp, offset in mine.items()})
        except Exception as exc:  # noqa: BLE001 - sorted by commit_failure_passes
            since = self._commit_failing_since = self._commit_failing_since or now
            if commit_failure_passes(exc, offsets, self.assignment()) and now - since < COMMIT_FAILURE_LIMIT_S:
                log.warning("a commit failed and is left to the next one",
                            extra={"error": f"{type(exc).__name__}: {exc}"[:300],
                                   "failing_for_s": round(now - since, 1)})
                return False
            log.exception("a commit failed; the worker stops", extra={"failing_for_s": round(now - since, 1)})
            await self.crash(exc)
            return False
        self._commit_failing_since = None
        return True


class LosslessConsumer(faust_aiokafka.Consumer):
    """C1-C6 (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = _NoReadOffsets()  # C3
        self._fetched: dict[TP, set[int]] = {}
        """C4: source-topic offsets fetched and not yet committed over, per partition."""

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedThread(self, loop=self.loop, beacon=self.beacon)  # C1

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        return None  # C4

    async def _wait_next_records(self, timeout: float) -> tuple[Any, Any]:
        records, active = await super()._wait_next_records(timeout)
        if records:  # C4: remember what was fetched, where acks decide the commit (as `_new_offset` does)
            acks_enabled_for = self.app.topics.acks_enabled_for
            for tp, batch in records.items():
                if acks_enabled_for(tp.topic) and not tp.topic.endswith(JOIN_SUFFIX):
                    self._fetched.setdefault(tp, set()).update(r.offset for r in batch)
        return records, active

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        await super().on_partitions_revoked(revoked)
        for tp in revoked:
            self._fetched.pop(tp, None)

    def _new_offset(self, tp: TP) -> int | None:
        """C5: the offset to commit for `tp`, never past an unacknowledged record."""
        acked = self._acked[tp]
        if not acked:
            return None
        committed = self._committed_offset[tp]
        if tp.topic.endswith(JOIN_SUFFIX):
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
        for tp, offset in committed.items():  # C2
            if not offset and not tp.topic.endswith("-changelog"):
                await self.seek(TP(tp.topic, tp.partition), 0)
                rewound.append(f"{tp.topic}/{tp.partition}")
        log.info("stream positions set from the committed offsets",
                 extra={"committed": {f"{tp.topic}/{tp.partition}": o for tp, o in committed.items()
                                      if not tp.topic.endswith("-changelog")}, "rewound": rewound})
        return committed


def install() -> None:
    """Make every faust app of this process use the patched producer and consumer (idempotent), and
    every aiokafka producer rewind a refused batch's sequence (P2)."""
    aiokafka_sender.SendProduceReqHandler = SequenceRewindingHandler  # looked up by name in Sender
    faust_aiokafka.Transport.Producer = IdempotentProducer
    faust_aiokafka.Transport.Consumer = LosslessConsumer
