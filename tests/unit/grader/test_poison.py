"""Failed batches --> retry, split, or one poison record (poison.py), without Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from confluent_kafka import KafkaError, KafkaException

from services.grader.core.poison import Bisector, Failure, _batch_backoff, classify, run_bisecting
from shared.retry import Backoff

TOO_BIG = Failure("MSG_SIZE_TOO_LARGE on graded", record_caused=True)
BROKER_DOWN = Failure("_TRANSPORT: broker down", record_caused=False)


def test_classify_tells_record_failures_from_cluster_failures() -> None:
    assert classify(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))).record_caused
    assert not classify(KafkaException(KafkaError(KafkaError._TRANSPORT))).record_caused
    assert not classify(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))).record_caused
    assert classify(MessageSizeTooLargeError()).record_caused
    assert not classify(KafkaTimeoutError()).record_caused
    assert classify(ValueError("a verifier blew up")).record_caused  # our code failing on a record
    aborted = classify(RuntimeError("commit failed"), "MSG_SIZE_TOO_LARGE on t.graded")
    assert aborted == Failure("MSG_SIZE_TOO_LARGE on t.graded", True)


def positions(offsets: Sequence[int], part: str = "p0") -> list[tuple[str, int]]:
    return [(part, o) for o in offsets]


def test_bisector_finds_the_poison_record_and_returns_to_whole_batches() -> None:
    """Records 0..7, record 5 poison: what the native stage does with the limit the bisector sets."""
    b = Bisector(batch_max=8)
    committed, attempts, poisoned = 0, 0, []
    while committed < 8:
        attempts += 1
        assert attempts < 20, "did not converge"
        batch = list(range(committed, min(8, committed + b.limit)))
        if 5 in batch:
            if b.failed(positions(batch), TOO_BIG):
                assert batch == [5]
                poisoned.append(5)
                b.poisoned()
                committed = 6
        else:
            b.succeeded(positions(batch))
            committed = batch[-1] + 1
    assert poisoned == [5] and b.limit == 8
    assert attempts <= 2 + 4 + 2  # twice whole, then halves: log2(8) steps, plus the successes in between


def test_bisector_never_splits_on_cluster_failures_and_needs_two_alike() -> None:
    b = Bisector(batch_max=100)
    batch = positions(range(100))
    for _ in range(5):
        assert not b.failed(batch, BROKER_DOWN)
    assert b.limit == 100
    assert not b.failed(batch, TOO_BIG) and b.limit == 100  # once may be chance
    assert not b.failed(batch, Failure("INVALID_RECORD on x", True)) and b.limit == 100  # another way
    assert not b.failed(batch, Failure("INVALID_RECORD on x", True)) and b.limit == 50  # the same way twice
    assert b.failed(positions([7]), Failure("INVALID_RECORD on x", True))


def test_bisector_restores_whole_batches_once_past_the_window_that_failed() -> None:
    b = Bisector(batch_max=10)
    batch = positions(range(10))
    b.failed(batch, TOO_BIG)
    b.failed(batch, TOO_BIG)
    assert b.limit == 5
    b.succeeded(positions(range(5)))  # the poison was a transient after all: the rest passes
    assert b.limit == 5
    b.succeeded(positions(range(5, 10)))
    assert b.limit == 10


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_run_bisecting_grades_every_good_item_and_poisons_only_the_bad_one() -> None:
    done: list[int] = []
    poisoned: list[int] = []

    async def attempt(chunk: Sequence[int]) -> None:
        if 13 in chunk:
            raise MessageSizeTooLargeError("record 13")
        done.extend(chunk)

    async def poison(item: int, f: Failure) -> None:
        poisoned.append(item)

    run(run_bisecting(list(range(20)), attempt, poison=poison, stage="t", backoff=lambda: Backoff(0.0, 0.0)))
    assert poisoned == [13] and done == [i for i in range(20) if i != 13]


def test_run_bisecting_retries_cluster_failures_without_splitting_or_poisoning() -> None:
    calls: list[int] = []

    async def attempt(chunk: Sequence[int]) -> None:
        calls.append(len(chunk))
        if len(calls) < 4:
            raise KafkaTimeoutError()

    async def poison(item: int, f: Failure) -> None:
        raise AssertionError("nothing is poison here")

    run(run_bisecting(list(range(8)), attempt, poison=poison, stage="t", backoff=lambda: Backoff(0.0, 0.0)))
    assert calls == [8, 8, 8, 8]


def test_run_bisecting_waits_on_the_shared_backoff_schedule() -> None:
    """Cluster failures wait the shared/retry.py schedule (0.2 s doubling to 10 s), one per chunk; a
    poison item's dead-lettering that fails waits on a schedule of its own."""
    made: list[Backoff] = []

    class Recording(Backoff):
        def __init__(self) -> None:
            super().__init__(0.0, 0.0, jitter=False)
            made.append(self)

    fails = {"cluster": 2, "poison": 1}

    async def attempt(chunk: Sequence[int]) -> None:
        if fails["cluster"]:
            fails["cluster"] -= 1
            raise KafkaTimeoutError()
        if 1 in chunk:
            raise MessageSizeTooLargeError("record 1")

    async def poison(item: int, f: Failure) -> None:
        if fails["poison"]:
            fails["poison"] -= 1
            raise KafkaTimeoutError()

    run(run_bisecting([0, 1], attempt, poison=poison, stage="t", backoff=Recording))
    # [0, 1]: 2 cluster failures and a first record-caused one wait, the second splits it; [0] passes;
    # [1] fails the confirmed way: poison at once; its dead letter fails once and waits
    assert [b.failures for b in made] == [3, 0, 0, 1]
    default = _batch_backoff()
    first, second = default.next(), default.next()
    assert 0.2 <= first <= 0.3 and 0.4 <= second <= 0.5  # + jitter of up to 0.1 s
    assert all(default.next() <= 10.0 for _ in range(20))


def test_run_bisecting_is_cancellable_while_it_retries() -> None:
    """Shutdown: a batch that keeps failing must not hold the worker (faust cancels the agent)."""
    async def attempt(chunk: Sequence[int]) -> None:
        raise KafkaTimeoutError()

    async def poison(item: int, f: Failure) -> None:
        raise AssertionError

    async def main() -> None:
        task = asyncio.ensure_future(run_bisecting([1, 2], attempt, poison=poison, stage="t",
                                                   backoff=lambda: Backoff(3600.0, 3600.0)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 5))
