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
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

log = logging.getLogger(__name__)


class TransactionAborted(RuntimeError):
    """The batch's transaction was aborted. Recoverable: the caller drops its in-memory changes and
    reprocesses from the committed offsets and state."""


class TxnProducer:
    def __init__(self, bootstrap: str, transactional_id: str, *, timeout_s: float,
                 extra: dict[str, Any] | None = None) -> None:
        self.timeout_s = timeout_s
        self._p = Producer({
            "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
            "enable.idempotence": True, "acks": "all", "transaction.timeout.ms": int(timeout_s * 1000),
            "linger.ms": 5, "compression.type": "lz4",
            # Java's (and aiokafka's, so the faust runtime's) partitioner: a session's graded records
            # land in the same partition whichever runtime emits them.
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
            **(extra or {})})
        # Fences an older instance with the same id and aborts the transaction it left open.
        self._retry(lambda: self._p.init_transactions(timeout_s))
        self.in_transaction = False
        self.records = 0

    def produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int = -1) -> None:
        """Add one record to the current transaction (begun on the first record)."""
        if not self.in_transaction:
            self._p.begin_transaction()
            self.in_transaction = True
        while True:
            try:
                self._p.produce(topic, value, key, partition=partition)
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
            self._p.begin_transaction()
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

    def close(self) -> None:
        self.abort()
        self._p.flush(5)

    def _retry(self, op: Any, attempts: int = 5) -> None:
        for i in range(attempts):
            try:
                op()
                return
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or i == attempts - 1:
                    raise
                log.warning("retrying a transaction step: %s", err)
                time.sleep(0.2 * (i + 1))
