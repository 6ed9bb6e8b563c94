"""Records of one batch + its input offsets --> one Kafka transaction (confluent-kafka).

Why transactions: the native runtime's outputs (graded records, dead letters, internal topic records),
its state changelog and the consumer offsets of the inputs it read commit together or not at all. A
crash at any point leaves either the whole batch (offsets included, so it is never processed again)
or none of it (its records are aborted, invisible to read_committed readers, and the batch is
processed again from the committed offsets against the committed state). Offsets go through
`send_offsets_to_transaction` with the consumer's group metadata, so a worker that lost its partitions
in a rebalance (a zombie) cannot commit anything for them (KIP-447).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from shared.kafka.client_logs import client_log_config
from shared.kafka.security import SecuritySource, librdkafka_config
from shared.retry import retrying
from shared.validation import KafkaHeaders

log = logging.getLogger(__name__)


class TransactionAborted(RuntimeError):
    """The batch's transaction was aborted. Recoverable: the caller drops its in-memory changes and
    reprocesses from the committed offsets and state."""


class FatalClientError(RuntimeError):
    """A Kafka client of the worker hit a fatal error: librdkafka will never use it again (fenced: another
    live instance took its transactional id or its static group membership, or a broker failover left
    it with a stale member id or producer epoch). Not recoverable in place: the worker must stop and exit
    non-zero, so that its supervisor starts it again with fresh clients, which restore the committed
    state and offsets (the same path as after a kill -9)."""


class FatalErrors:
    """The first fatal error a client reported through its `error_cb`. librdkafka reports a fatal error
    once, from inside a poll/consume call, and then answers nothing: a worker that only logs it keeps
    running with dead clients (its process alive, grading nothing), so every loop round checks here.
    Every error is also handed to `report` (shared/kafka/client_logs.py's rate-limited lines: an
    unreachable broker is one line at most every 30 s)."""

    def __init__(self, client: str, report: Callable[[KafkaError], None] | None = None) -> None:
        self.client = client
        self.report = report
        self.error: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        """The clients' `error_cb` (called on the thread that polls). Non-fatal errors are retried by
        librdkafka itself."""
        if self.report is not None:
            self.report(err)
        if (err.fatal() or err.code() == KafkaError._FATAL) and self.error is None:
            log.error("fatal Kafka client error", extra={"client": self.client, "error": err.str()})
            self.error = err

    def raise_if_any(self) -> None:
        if self.error is not None:
            raise FatalClientError(f"{self.client}: {self.error.str()}")


class StallWatchdog:
    """Exits the process when one transactional call blocks past `limit_s`. librdkafka does not always
    honour the timeout of a transactional call: after a broker kill -9 + restart,
    `send_offsets_to_transaction` was seen waiting forever inside librdkafka, leaving a live process that
    grades nothing. Such a call cannot be interrupted from Python, so the worker exits with status 1
    (its supervisor restarts it; the restart is the kill -9 case: the broker, or the restarted worker's
    `init_transactions`, aborts the open transaction)."""

    def __init__(self, limit_s: float, name: str) -> None:
        self.limit_s = limit_s
        self.name = name
        self._since: float | None = None
        self._op = ""
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name=f"txn-watchdog-{name}", daemon=True).start()

    def enter(self, op: str) -> None:
        self._op, self._since = op, time.monotonic()

    def leave(self) -> None:
        self._since = None

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            since = self._since
            if since is not None and time.monotonic() - since > self.limit_s:
                log.error("a transactional call is stuck inside librdkafka; exiting for a restart",
                          extra={"producer": self.name, "call": self._op, "seconds": round(self.limit_s)})
                logging.shutdown()
                os._exit(1)


class TxnProducer:
    def __init__(self, bootstrap: str, transactional_id: str, *, timeout_s: float,
                 extra: dict[str, Any] | None = None, security: SecuritySource = None) -> None:
        self.timeout_s = timeout_s
        logs = client_log_config(bootstrap)
        self.fatal = FatalErrors(f"producer {transactional_id}", logs["error_cb"])
        self.watchdog = StallWatchdog(timeout_s + 15.0, transactional_id)
        self._p = Producer({
            **librdkafka_config(security), **logs,
            "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
            "enable.idempotence": True, "acks": "all", "transaction.timeout.ms": int(timeout_s * 1000),
            "linger.ms": 5, "compression.type": "lz4",
            # Java's (and aiokafka's, so the faust runtime's) partitioner: a session's graded records
            # land in the same partition whichever runtime emits them.
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
            "error_cb": self.fatal, **(extra or {})})
        # Fences an older instance with the same id and aborts the transaction it left open.
        self._retry(lambda: self._p.init_transactions(timeout_s))
        self.in_transaction = False
        self.records = 0
        self.delivery_error = ""
        """The first record of the current transaction that Kafka refused: `<error name> on <topic>`
        (a commit that fails only says that *something* failed; poison.py needs to know what)."""

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None and not self.delivery_error:
            self.delivery_error = f"{err.name()} on {msg.topic()}"

    def check(self) -> None:
        """Serve the producer's callbacks; raise FatalClientError if it reported a fatal error (the
        transactional calls raise theirs directly; this catches one reported between batches)."""
        self._p.poll(0)
        self.fatal.raise_if_any()

    def produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int = -1, *,
                headers: KafkaHeaders | None = None) -> None:
        """Add one record to the current transaction (begun on the first record)."""
        if not self.in_transaction:
            self._retry(self._p.begin_transaction)
            self.in_transaction = True
        while True:
            try:
                self._p.produce(topic, value, key, partition=partition, headers=headers,
                                on_delivery=self._delivered)
                break
            except BufferError:  # local queue full: let librdkafka send some
                self._p.poll(0.05)
        self.records += 1

    def flush(self) -> None:
        """Wait until every record so far is in the log (still uncommitted). Tests use it to crash with
        a transaction's records written but not committed."""
        self._p.flush(self.timeout_s)

    def commit(self, offsets: Sequence[TopicPartition], group_metadata: Any) -> None:
        """Commit the current transaction with `offsets` (the next offset to read per input partition).
        Raises TransactionAborted when Kafka made it abort; fatal errors (fenced) propagate."""
        if not self.in_transaction:
            if not offsets:
                return
            self._retry(self._p.begin_transaction)
            self.in_transaction = True
        try:
            if offsets:
                self._retry(lambda: self._p.send_offsets_to_transaction(list(offsets), group_metadata,
                                                                       self.timeout_s))
            self._retry(lambda: self._p.commit_transaction(self.timeout_s))
        except KafkaException as e:
            if not e.args[0].txn_requires_abort():
                raise
            self.abort()
            raise TransactionAborted(str(e.args[0])) from e
        finally:
            self.in_transaction = False
            self.records = 0

    def abort(self) -> None:
        """Abort the current transaction, if any (its records become invisible to read_committed readers)."""
        if self.in_transaction or self.records:
            self._retry(lambda: self._p.abort_transaction(self.timeout_s))
        self.in_transaction = False
        self.records = 0

    def take_delivery_error(self) -> str:
        """The delivery error recorded since the last call (and forget it): read after a failed batch."""
        self._p.poll(0)
        err, self.delivery_error = self.delivery_error, ""
        return err

    def close(self) -> None:
        """Abort what is open and let go. Never raises: it runs on the way out after errors, and a fatal
        producer can neither abort nor flush (the broker aborts its transaction, or a restarted worker's
        `init_transactions` does)."""
        self.watchdog.stop()
        if self.fatal.error is not None:
            return
        try:
            if self.in_transaction or self.records:
                self.in_transaction, self.records = False, 0
                self._p.abort_transaction(min(self.timeout_s, 10.0))  # once: the broker may be gone
            self._p.flush(5)
        except KafkaException as e:
            log.warning("could not abort the open transaction on close: %s", e.args[0])

    def _retry(self, op: Any, attempts: int = 5) -> None:
        """`op()` (one transactional call), again while Kafka says its error is retriable (shared/retry.py:
        up to `attempts` tries, 0.2 s growing to 1 s apart); a fatal error is also recorded in `fatal`."""
        name = getattr(op, "__name__", "transaction step")
        for attempt in retrying(retry_on=_retriable, what=f"transaction step {name}", attempts=attempts,
                                first_s=0.2, max_s=1.0, log=log):
            with attempt:
                self.watchdog.enter(name)
                try:
                    op()
                except KafkaException as e:
                    if e.args[0].fatal():
                        self.fatal(e.args[0])
                    raise
                finally:
                    self.watchdog.leave()


def _retriable(e: BaseException) -> bool:
    return isinstance(e, KafkaException) and bool(e.args[0].retriable())
