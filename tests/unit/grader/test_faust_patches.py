"""What services/grader/stream/patches.py relies on in the installed faust-streaming and aiokafka.

Each workaround overrides a private method or attribute. These tests pin, per workaround (P1, P2, C1-C6 in
the module's docstring), that the overridden faust method still exists with the signature the patch
assumes, that the unpatched behaviour it repairs is still faust's (so a faust release that fixes or
changes it fails here, and the patch can be reconsidered), and that the patch does what it says (P2's,
against the broker, in tests/integration/test_aiokafka_refused_batch.py). They also pin the faust
internals the faust runtime reads outside the patches (faust_ticker.py). No broker: faust builds its
consumers and producers without connecting.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import aiokafka
import faust
import pytest
from aiokafka.producer import sender as aiokafka_sender
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from services.grader.stream import patches as faust_patches
from services.grader.stream.patches import IdempotentProducer, LosslessConsumer, ReadCommittedThread

SRC = TP("test.apprentice.interactions.v1", 0)
JOIN = TP("test.apprentice-grader-join", 0)


def params(fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(fn).parameters)


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro
    return asyncio.run(main())


@pytest.fixture
def app() -> Iterator[faust.App]:
    """A faust app that is never started (nothing connects)."""
    yield faust.App("patches-test", broker="kafka://127.0.0.1:1", web_enabled=False, autodiscover=False,
                    store="memory://")


async def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def consumer(app: faust.App, cls: type[faust_aiokafka.Consumer]) -> Any:
    return cls(app.transport, callback=_noop, on_partitions_revoked=_noop, on_partitions_assigned=_noop)


# --- install -------------------------------------------------------------------------------------------
def test_install_swaps_the_patched_classes_into_fausts_aiokafka_transport() -> None:
    import services.grader.stream.app  # noqa: F401 - installs on import, before any faust app exists

    assert faust_aiokafka.Transport.Consumer is LosslessConsumer
    assert faust_aiokafka.Transport.Producer is IdempotentProducer
    assert aiokafka_sender.SendProduceReqHandler is faust_patches.SequenceRewindingHandler  # P2
    faust_patches.install()  # again: no harm
    assert faust_patches.SequenceRewindingHandler.__mro__[1].__module__ == "aiokafka.producer.sender"
    assert faust_aiokafka.Transport.Consumer is LosslessConsumer
    assert issubclass(LosslessConsumer, faust_aiokafka.Consumer)
    assert issubclass(IdempotentProducer, faust_aiokafka.Producer)
    assert issubclass(ReadCommittedThread, faust_aiokafka.AIOKafkaConsumerThread)


# --- P1: idempotent producer ---------------------------------------------------------------------------
def test_p1_faust_enables_idempotence_only_in_a_transaction_and_the_patch_always(app: faust.App) -> None:
    assert params(faust_aiokafka.Producer._settings_extra) == ["self"]
    assert faust_aiokafka.Producer(app.transport)._settings_extra() == {}  # app not in exactly_once
    assert IdempotentProducer(app.transport)._settings_extra() == {"acks": "all", "enable_idempotence": True}
    assert "enable_idempotence" in params(aiokafka.AIOKafkaProducer.__init__)


# --- P2: a refused batch gives its sequence back ------------------------------------------------------
P2_TP = aiokafka.TopicPartition("test.apprentice.graded.v1", 0)


def _sent_batch(base: int, records: int, error: BaseException | None) -> Any:
    """An aiokafka batch of `records` records numbered from `base`, built as the sender builds it, and
    answered with `error` (None: appended)."""
    from aiokafka.producer.message_accumulator import BatchBuilder, MessageBatch

    builder = BatchBuilder(batch_size=16384, compression_type=0)
    for i in range(records):
        builder.append(key=None, value=f"v{i}".encode(), timestamp=None)
    batch = MessageBatch(P2_TP, builder, ttl=30, linger_time=0)
    batch.set_producer_state(producer_id=7, producer_epoch=0, base_sequence=base)
    batch.get_data_buffer()
    if error is None:
        batch.done(base_offset=0)
    else:
        batch.failure(exception=error)
    return batch


def _idempotent_txn(next_sequence: int) -> Any:
    from aiokafka.producer.transaction_manager import TransactionManager

    txn = TransactionManager(transactional_id=None, transaction_timeout_ms=60000)
    txn.set_pid_and_epoch(7, 0)
    txn._sequence_numbers[P2_TP] = next_sequence
    return txn


@pytest.mark.parametrize(("base", "records", "advanced_to"), [
    (10, 3, 13),                       # the plain case: 13 back to 10
    (2**31 - 2, 5, -(2**31) + 3),      # the numbers wrapped past 2**31 - 1 while the batch was sent
])
def test_p2_a_refused_batch_sets_the_next_sequence_back_to_its_first(base: int, records: int,
                                                                      advanced_to: int) -> None:
    async def case() -> None:
        txn = _idempotent_txn(advanced_to)
        batch = _sent_batch(base, records, aiokafka.errors.MessageSizeTooLargeError())
        assert faust_patches.rewind_refused(txn, {P2_TP: batch}) == [P2_TP]
        assert txn.sequence_number(P2_TP) == base
    run(case())


@pytest.mark.parametrize("error", [None, aiokafka.errors.OutOfOrderSequenceNumber(),
                                   aiokafka.errors.NotLeaderForPartitionError()])
def test_p2_an_appended_or_otherwise_failed_batch_keeps_its_numbers(error: BaseException | None) -> None:
    async def case() -> None:
        txn = _idempotent_txn(13)
        assert faust_patches.rewind_refused(txn, {P2_TP: _sent_batch(10, 3, error)}) == []
        assert txn.sequence_number(P2_TP) == 13
    run(case())


def test_p2_rewinds_neither_a_batch_that_is_not_the_partitions_last_nor_a_transactional_one() -> None:
    async def case() -> None:
        txn = _idempotent_txn(20)  # numbers 13-19 were handed out after the refused batch's 10-12
        refused = _sent_batch(10, 3, aiokafka.errors.MessageSizeTooLargeError())
        assert faust_patches.rewind_refused(txn, {P2_TP: refused}) == []
        assert txn.sequence_number(P2_TP) == 20
        txn = _idempotent_txn(13)
        txn.transactional_id = "grader-0"
        assert faust_patches.rewind_refused(txn, {P2_TP: refused}) == []
        assert faust_patches.rewind_refused(None, {P2_TP: refused}) == []
    run(case())


def test_p2_aiokafka_still_numbers_batches_when_drained_and_looks_the_handler_up_by_name() -> None:
    from aiokafka.producer import message_accumulator

    assert "increment_sequence_number" in inspect.getsource(message_accumulator.MessageAccumulator._pop_batch)
    assert "SendProduceReqHandler(self, batches)" in inspect.getsource(aiokafka_sender.Sender._send_produce_req)
    assert params(aiokafka_sender.SendProduceReqHandler.handle_response) == ["self", "response"]


# --- C1: read_committed ----------------------------------------------------------------------------------
def test_c1_faust_reads_uncommitted_outside_exactly_once_and_the_patched_thread_committed(app: faust.App) -> None:
    async def main() -> tuple[str, str]:
        base = consumer(app, faust_aiokafka.Consumer)._new_consumer_thread()
        patched = consumer(app, LosslessConsumer)._new_consumer_thread()
        assert type(base) is faust_aiokafka.AIOKafkaConsumerThread and type(patched) is ReadCommittedThread
        assert params(faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer) == ["self", "transport"]
        kb = base._create_worker_consumer(app.transport)  # type: ignore[arg-type]  # faust types it loosely
        kp = patched._create_worker_consumer(app.transport)
        levels = (kb._isolation_level, kp._isolation_level)
        await kb.stop()
        await kp.stop()
        return levels

    assert run(main()) == ("read_uncommitted", "read_committed")
    # the attribute the patch sets is what aiokafka's start() hands to its fetcher
    assert "isolation_level=self._isolation_level" in inspect.getsource(aiokafka.AIOKafkaConsumer.start)


# --- C2: partitions without a committed offset are rewound ------------------------------------------------
def test_c2_aiokafka_does_not_seek_a_partition_without_a_committed_offset() -> None:
    """The unpatched behaviour: `seek_to_committed` leaves such a partition where the fetcher was."""
    a, b = aiokafka.TopicPartition("t", 0), aiokafka.TopicPartition("t", 1)
    kc = aiokafka.AIOKafkaConsumer.__new__(aiokafka.AIOKafkaConsumer)
    kc._subscription = SimpleNamespace(assigned_partitions=lambda: {a, b})
    seeks: list[tuple[Any, int]] = []
    kc._fetcher = SimpleNamespace(seek_to=lambda tp, offset: seeks.append((tp, offset)))

    async def committed(tp: Any) -> int | None:
        return {a: None, b: 7}[tp]

    kc.committed = committed  # type: ignore[method-assign]
    assert run(aiokafka.AIOKafkaConsumer.seek_to_committed(kc)) == {a: None, b: 7}
    assert seeks == [(b, 7)]  # `a` was not sought: the patch seeks it to 0 itself


def test_c2_the_patch_overrides_fausts_seek_to_committed_as_it_is_declared() -> None:
    for cls in (faust_consumer.Consumer, faust_consumer.ThreadDelegateConsumer):
        assert inspect.iscoroutinefunction(cls.seek_to_committed) and params(cls.seek_to_committed) == ["self"]
    assert params(faust_consumer.Consumer.seek) == ["self", "partition", "offset"]
    assert inspect.iscoroutinefunction(LosslessConsumer.seek_to_committed)


# --- C3: no read-offset drops ------------------------------------------------------------------------------
def test_c3_faust_drops_a_record_below_the_read_offset_which_it_reads_through_getitem() -> None:
    src = inspect.getsource(faust_consumer.Consumer._drain_messages)
    assert "get_read_offset = self._read_offset.__getitem__" in src
    assert "if r_offset is None or offset >= r_offset:" in src  # else: the record is dropped
    assert "DROPPED MESSAGE ROFF" in src


def test_c3_the_patched_consumer_never_remembers_a_read_offset(app: faust.App) -> None:
    async def main() -> None:
        base, patched = consumer(app, faust_aiokafka.Consumer), consumer(app, LosslessConsumer)
        assert isinstance(base._read_offset, defaultdict)  # what the patch replaces, set in __init__
        patched._read_offset[SRC] = 42
        get = patched._read_offset.__getitem__
        assert get(SRC) is None

    run(main())


# --- C4: no gaps; the commit decides from what was fetched ---------------------------------------------------
def test_c4_faust_counts_a_read_gap_as_acknowledged_and_commits_over_it(app: faust.App) -> None:
    """Records 11-13 fetched and lost, 10 and 14 acknowledged: faust commits 15 (11-13 never graded);
    the patch commits 11, on a source topic (from what was fetched) as on the join topic (no gap)."""
    async def main() -> list[int | None]:
        assert params(faust_consumer.Consumer._add_gap) == ["self", "tp", "offset_from", "offset_to"]
        out = []
        for cls, tp in ((faust_aiokafka.Consumer, SRC), (LosslessConsumer, SRC), (LosslessConsumer, JOIN)):
            c = consumer(app, cls)
            c._committed_offset[tp] = 10
            c._acked[tp].extend([10, 14])
            c._acked_index[tp].update([10, 14])
            await c._add_gap(tp, 11, 13)  # as _drain_messages calls it: read offset 10, then offset 14
            if cls is LosslessConsumer and tp == SRC:
                c._fetched[tp] = {10, 11, 12, 13, 14}
            out.append(c._new_offset(tp))
        return out

    assert run(main()) == [15, 11, 11]


def test_c4_fetched_offsets_are_collected_from_fausts_wait_next_records() -> None:
    for cls in (faust_consumer.Consumer, LosslessConsumer):
        assert inspect.iscoroutinefunction(cls._wait_next_records)
        assert params(cls._wait_next_records) == ["self", "timeout"]
    src = inspect.getsource(faust_consumer.Consumer.getmany)
    assert "await self._wait_next_records(timeout)" in src and "records, active_partitions" in src
    assert inspect.iscoroutinefunction(faust_consumer.Consumer.on_partitions_revoked)
    assert params(faust_consumer.Consumer.on_partitions_revoked) == ["self", "revoked"]


# --- C5: no commit over one unacknowledged record --------------------------------------------------------------
def test_c5_faust_commits_over_one_unacknowledged_record(app: faust.App) -> None:
    async def main() -> list[int | None]:
        assert params(faust_consumer.Consumer._new_offset) == ["self", "tp"]
        out = []
        for cls, tp in ((faust_aiokafka.Consumer, SRC), (LosslessConsumer, SRC), (LosslessConsumer, JOIN)):
            c = consumer(app, cls)
            c._committed_offset[tp] = 11  # the next offset to read: 11 was never acknowledged
            c._acked[tp].extend([12, 13, 14])
            c._acked_index[tp].update([12, 13, 14])
            if cls is LosslessConsumer:
                c._fetched[tp] = {11, 12, 13, 14}
            out.append(c._new_offset(tp))
        return out

    assert run(main()) == [15, None, None]  # faust skips 11; the patch holds the commit on it


def test_c5_with_no_commit_yet_faust_checks_nothing_and_the_patch_does(app: faust.App) -> None:
    async def main() -> list[int | None]:
        out = []
        for cls in (faust_aiokafka.Consumer, LosslessConsumer):
            c = consumer(app, cls)
            c._acked[SRC].extend([5, 6])
            c._acked_index[SRC].update([5, 6])
            if cls is LosslessConsumer:
                c._fetched[SRC] = {3, 4, 5, 6}  # 3 and 4 were fetched, never acknowledged
            out.append(c._new_offset(SRC))
        return out

    assert run(main()) == [7, None]


def test_c5_a_contiguous_join_partition_commits_as_faust_does(app: faust.App) -> None:
    async def main() -> int | None:
        c = consumer(app, LosslessConsumer)
        c._committed_offset[JOIN] = 11
        c._acked[JOIN].extend([11, 12])
        c._acked_index[JOIN].update([11, 12])
        return c._new_offset(JOIN)  # type: ignore[no-any-return]

    assert run(main()) == 13


# --- C6: a commit that a rebalance raced does not crash the worker -----------------------------------------------
def test_c6_faust_crashes_the_worker_on_a_commit_error_and_aiokafka_raises_one_for_a_revoked_partition() -> None:
    src = inspect.getsource(faust_aiokafka.AIOKafkaConsumerThread._commit)
    assert params(faust_aiokafka.AIOKafkaConsumerThread._commit) == ["self", "offsets"]
    assert "except IllegalStateError" in src and src.count("await self.crash(exc)") == 3
    assert "if tp in self.assignment()" in src  # checked before the commit awaits
    assert 'is not assigned' in inspect.getsource(aiokafka.AIOKafkaConsumer.commit)
    # the patch calls what faust's does
    for name in ("_ensure_consumer", "assignment", "crash"):
        assert callable(getattr(ReadCommittedThread, name)), name
    assert callable(faust_aiokafka.ensure_aiokafka_TP)


@pytest.mark.parametrize("subscribed", [True, False])
def test_c6_a_commit_whose_partitions_a_rebalance_took_crashes_faust_and_not_the_patch(app: faust.App,
                                                                                       subscribed: bool) -> None:
    """Offsets faust found assigned reach the consumer thread after a rebalance took them: aiokafka holds
    no assignment (subscribed: the rebalance window; or no subscription at all). Real faust and aiokafka
    objects, nothing connects."""
    async def main(cls: type[faust_aiokafka.Consumer]) -> tuple[bool, BaseException | None]:
        thread = consumer(app, cls)._new_consumer_thread()
        kafka = thread._consumer = thread._create_worker_consumer(app.transport)
        if subscribed:
            kafka.subscribe(["t"])
        try:
            return await thread._commit({SRC: 5}), thread.crash_reason
        finally:
            await kafka.stop()

    committed, crashed = run(main(faust_aiokafka.Consumer))
    assert not committed and isinstance(crashed, aiokafka.errors.IllegalStateError)  # the worker would stop
    assert run(main(LosslessConsumer)) == (False, None)


A, B = TP("t", 0), TP("t", 1)


@pytest.mark.parametrize(("exc", "assigned", "passes"), [
    (aiokafka.errors.IllegalStateError(f"Partition {B} is not assigned"), {A}, True),   # revoked meanwhile
    (aiokafka.errors.IllegalStateError("something else"), {A, B}, False),              # still ours: a real fault
    (aiokafka.errors.CommitFailedError("the group has already rebalanced"), {A, B}, True),
    (aiokafka.errors.KafkaTimeoutError(), {A, B}, True),
    (TimeoutError(), {A, B}, True),
    (aiokafka.errors.RequestTimedOutError(), {A, B}, True),                            # retriable
    (aiokafka.errors.GroupAuthorizationFailedError(), {A, B}, False),                  # not retriable
    (aiokafka.errors.KafkaError("fatal"), {A, B}, False),
    (RuntimeError("a bug"), {A, B}, False),
])
def test_c6_which_commit_failures_pass(exc: BaseException, assigned: set[TP], passes: bool) -> None:
    assert faust_patches.commit_failure_passes(exc, {A, B}, assigned) is passes


# --- faust internals the runtime reads outside the patches ------------------------------------------------------
def test_faust_internals_the_ticker_reads_are_still_there(app: faust.App) -> None:
    async def main() -> None:
        c = consumer(app, LosslessConsumer)
        assert isinstance(c._committed_offset, defaultdict) and c._committed_offset[SRC] is None
        for name in ("highwaters", "seek", "resume_partitions"):
            assert callable(getattr(c, name)), name
        assert callable(app.assignor.assigned_actives)
        assert app.tables.recovery.completed.is_set() is False  # type: ignore[attr-defined]
        assert app.rebalancing is False
        assert callable(app.topics.acks_enabled_for)

    run(main())
