"""Fatal Kafka client errors stop the native worker instead of being logged and polled past.

librdkafka reports a fatal error (a fenced static member or producer) once, and the client never works
again; a worker that only logs it stays alive and grades nothing (seen after a broker kill -9 + restart
in the chaos test). These pin down the detection; test_grader_restart.py shows a fenced worker exit."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.grader.stage import _usable
from services.grader.txn import FatalClientError, FatalErrors, TxnProducer


class _Msg:
    """What `_usable` reads of a consumed record: its error."""

    def __init__(self, err: KafkaError | None) -> None:
        self._err = err

    def error(self) -> KafkaError | None:
        return self._err


FENCED = "Static consumer fenced by other consumer with same group.instance.id"


def test_the_fatal_event_consume_returns_stops_the_loop() -> None:
    # consume() hands it over as code _FATAL with fatal() False: the case that was logged and ignored
    err = KafkaError(KafkaError._FATAL, f"Fatal error: Broker: {FENCED}")
    assert not err.fatal()
    with pytest.raises(FatalClientError, match="fenced"):
        _usable(_Msg(err))  # type: ignore[arg-type]
    with pytest.raises(FatalClientError):
        _usable(_Msg(KafkaError(KafkaError.FENCED_INSTANCE_ID, FENCED, fatal=True)))  # type: ignore[arg-type]


def test_ordinary_consumer_events_do_not_stop_it() -> None:
    assert _usable(_Msg(None)) is True  # type: ignore[arg-type]
    assert _usable(_Msg(KafkaError(KafkaError._PARTITION_EOF))) is False  # type: ignore[arg-type]
    assert _usable(_Msg(KafkaError(KafkaError._TRANSPORT, "broker down", retriable=True))) is False  # type: ignore[arg-type]


def test_error_callback_keeps_the_first_fatal_error_and_ignores_the_rest() -> None:
    errors = FatalErrors("grade consumer")
    errors(KafkaError(KafkaError._TRANSPORT, "broker down"))
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all down"))
    errors.raise_if_any()  # retried by librdkafka: nothing to do
    errors(KafkaError(KafkaError.PRODUCER_FENCED, "fenced by a newer instance", fatal=True))
    errors(KafkaError(KafkaError._FATAL, "second report"))
    with pytest.raises(FatalClientError, match="grade consumer: fenced by a newer instance"):
        errors.raise_if_any()


class _Watchdog:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def enter(self, op: str) -> None:
        self.calls.append(f"enter {op}")

    def leave(self) -> None:
        self.calls.append("leave")


def _producer_shell() -> TxnProducer:
    """A TxnProducer without its librdkafka client: what `_retry` uses (watchdog, fatal)."""
    p = TxnProducer.__new__(TxnProducer)
    p.watchdog = _Watchdog()  # type: ignore[assignment]
    p.fatal = FatalErrors("producer t")
    return p


def test_transaction_steps_are_retried_while_kafka_says_retriable() -> None:
    p = _producer_shell()
    tries: list[int] = []

    def begin_transaction() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=True))

    p._retry(begin_transaction)
    assert len(tries) == 3
    assert p.watchdog.calls == ["enter begin_transaction", "leave"] * 3  # type: ignore[attr-defined]


def test_a_transaction_step_is_not_retried_past_a_non_retriable_or_fatal_error() -> None:
    p = _producer_shell()
    tries: list[int] = []

    def commit_transaction() -> None:
        tries.append(1)
        raise KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, "fenced by a newer instance", fatal=True))

    with pytest.raises(KafkaException):
        p._retry(commit_transaction)
    assert len(tries) == 1
    with pytest.raises(FatalClientError, match="fenced"):
        p.fatal.raise_if_any()  # recorded for the loop, which stops the worker

    tries.clear()

    def flaky() -> None:
        tries.append(1)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True))

    with pytest.raises(KafkaException, match="slow"):
        p._retry(flaky, attempts=3)
    assert len(tries) == 3  # then the last error is the caller's
