"""Failed batches --> retry, split, or one poison record (poison.py), without Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from confluent_kafka import KafkaError, KafkaException

from services.grader.core.poison import Failure, _batch_backoff, classify, run_bisecting
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
