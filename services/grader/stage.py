"""Consumed batch --> processed outputs + input offsets in one Kafka transaction, forever (confluent-kafka).

The loop of the native runtime's stages (grading, judging). Each stage has a consumer group, a
transactional producer and a table whose working copy lives in memory and whose durable copy is a
compacted changelog, partitioned like one of its input topics (`state_topic`):

    consume(batch) -> process (state changes in memory, records into the open transaction)
                   -> commit(records + changelog + offsets of everything consumed)

- given a partition of `state_topic` (rebalance), the stage reads that partition's changelog into
  memory before it processes any record (`load`), and forgets it when the partition is taken away;
- an aborted transaction undoes the batch in Kafka; the stage then undoes it in memory (reloads its
  partitions from the changelog) and rewinds its consumer to the committed offsets;
- so does any other failure of a batch; a failure that a record caused and that repeats the same way
  splits the batch until the one record is found, which is dead-lettered on its own (poison.py): one
  record the broker refuses no longer stops the grader;
- nothing is pending between batches: rebalance callbacks run inside `consume`, after the previous
  batch committed, so a partition changes hands only between transactions;
- a fatal client error (either client fenced; e.g. librdkafka's static member fenced by its own rejoin
  after a broker restart) ends the loop with FatalClientError: the worker exits non-zero and its
  supervisor restarts it, which is the kill -9 path (fresh clients, committed state and offsets).
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from services.grader import metrics as M
from services.grader.changelog import read_table
from services.grader.config import GraderSettings
from services.grader.join import Rejected
from services.grader.poison import POISON_STAGE, Bisector, Failure, classify
from services.grader.routing import DEADLETTER_HEADERS, dead_letter
from services.grader.txn import FatalClientError, FatalErrors, TransactionAborted, TxnProducer
from shared.kafka.busy import WorkAbandoned
from shared.kafka.client_logs import client_log_config
from shared.kafka.security import librdkafka_config
from shared.retry import Backoff

log = logging.getLogger(__name__)

AfterCommit = Callable[[], None]


class TxnStage(abc.ABC):
    def __init__(self, settings: GraderSettings, *, name: str, group: str, topics: list[str],
                 state_topic: str, changelog: str, member: str, batch_max: int, poll_s: float) -> None:
        """`group`: the bare group name; its group id and the producer's transactional id carry the
        stack's namespace (shared/topics.py), so two stacks on one cluster never fence each other."""
        self.settings = settings
        self.name = name
        self.state_topic = state_topic
        self.changelog = changelog
        self.batch_max = batch_max
        self.poll_s = poll_s
        bootstrap = settings.common.kafka_bootstrap
        logs = client_log_config(bootstrap)
        self.fatal = FatalErrors(f"{name} consumer", logs["error_cb"])
        namespace = settings.common.topics
        group_id = namespace.group_id(group)
        self.producer = TxnProducer(bootstrap, namespace.transactional_id(f"{group}-{member}"),
                                    timeout_s=settings.transaction_timeout_s,
                                    security=settings.common)
        self.consumer = Consumer({
            **librdkafka_config(settings.common), **logs,
            "bootstrap.servers": bootstrap, "group.id": group_id, "group.instance.id": f"{group_id}-{member}",
            # range: every worker gets its share of *each* topic (the state lives with the join partitions;
            # a balanced-overall assignor may give one worker all of them and the other only routing).
            "partition.assignment.strategy": "range", "isolation.level": "read_committed",
            "enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": int(settings.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(min(3.0, settings.session_timeout_s / 4) * 1000),
            "max.poll.interval.ms": int(settings.max_poll_interval_s * 1000), "error_cb": self.fatal})
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)
        self.bisect = Bisector(batch_max)
        self._stop = threading.Event()
        self._backoff = Backoff(first_s=0.5, max_s=5.0)
        """Waits between retries of a batch the cluster failed (shared/retry.py); reset by a success."""

    # --- what a stage does ----------------------------------------------------------------------------
    @abc.abstractmethod
    def load(self, partition: int, table: dict[bytes, bytes]) -> None:
        """Take over `partition`: its table as read from the changelog (key -> latest value)."""

    @abc.abstractmethod
    def drop(self, partition: int) -> None:
        """Forget `partition` (revoked, or reloaded after an aborted transaction)."""

    @abc.abstractmethod
    def process(self, msgs: Sequence[Message], now: float) -> AfterCommit | None:
        """Apply one batch (possibly empty: timers), producing into `self.producer`. Returns what to do
        once the transaction committed (metrics), if anything."""

    # --- the loop -------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        while not stop.is_set():
            self.step()

    def step(self) -> None:
        msgs = [m for m in self.consumer.consume(self.batch_max, self.poll_s) if _usable(m)]
        self.check()
        if len(msgs) > self.bisect.limit:  # bisecting a batch that failed (poison.py)
            self._put_back(msgs[self.bisect.limit:])
            msgs = msgs[:self.bisect.limit]
        try:
            after = self.process(msgs, time.time())
            if not msgs and not self.producer.in_transaction:
                return
            offsets = [tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0]
            self.producer.commit(offsets, self.consumer.consumer_group_metadata())
        except FatalClientError:
            raise
        except WorkAbandoned:  # stopping mid-batch: nothing of it commits, the next owner reads it again
            self.producer.abort()
            return
        except Exception as e:  # noqa: BLE001 - every batch failure is undone and retried (or bisected)
            self._failed(msgs, e)
            return
        self._backoff.reset()
        self.bisect.succeeded(_positions(msgs))
        if after is not None:
            after()

    def _failed(self, msgs: Sequence[Message], exc: Exception) -> None:
        """Undo the batch (abort, committed state and offsets), then retry it whole, split it, or
        dead-letter its one record, as poison.py decides."""
        delivery = self.producer.take_delivery_error()
        if isinstance(exc, TransactionAborted) and not delivery:
            failure = Failure(f"transaction aborted: {exc}", record_caused=False)  # the cluster, not a record
        else:
            failure = classify(exc, delivery)
        log.warning("batch failed; reprocessing from the committed offsets",
                    exc_info=not isinstance(exc, KafkaException | TransactionAborted),
                    extra={"stage": self.name, "records": len(msgs), "failure": failure.signature[:300]})
        self.producer.abort()
        self.check()
        self.rewind()
        if self.bisect.failed(_positions(msgs), failure):
            self._dead_letter_poison(msgs[0], failure)
        elif not failure.record_caused:
            self._stop.wait(self._backoff.next())

    def _dead_letter_poison(self, msg: Message, failure: Failure) -> None:
        """The one record every batch failed on: a dead letter and the offset past it, in a transaction
        of their own; every other record is processed as usual."""
        letter = dead_letter(Rejected(POISON_STAGE, f"every batch holding this record failed the same way: "
                                                    f"{failure.signature}", "PoisonRecord"),
                             source="grader", topic=msg.topic() or "", partition=msg.partition() or 0,
                             offset=msg.offset() or 0, key=msg.key(), value=msg.value())
        past = TopicPartition(msg.topic() or "", msg.partition() or 0, (msg.offset() or 0) + 1)
        try:
            self.producer.produce(self.settings.common.topics.deadletter, letter.original_key or None,
                                  letter.SerializeToString(), headers=DEADLETTER_HEADERS)
            self.producer.commit([past], self.consumer.consumer_group_metadata())
        except FatalClientError:
            raise
        except Exception as e:  # noqa: BLE001 - retried: the next batch fails on it again, and comes back here
            log.error("could not dead-letter a poison record; retrying", extra={"stage": self.name, "error": str(e)})
            self.producer.abort()
            self.rewind()
            self._stop.wait(self._backoff.next())
            return
        self.consumer.seek(past)
        self.bisect.poisoned()
        M.DEADLETTERS.labels(POISON_STAGE).inc()
        log.error("dead-lettered a poison record", extra={"stage": self.name, "failure": failure.signature[:300],
                                                          "origin": f"{msg.topic()}/{msg.partition()}@{msg.offset()}"})

    def _put_back(self, rest: Sequence[Message]) -> None:
        """Seek each partition of `rest` back to its first record there: they come again next batch."""
        first: dict[tuple[str, int], int] = {}
        for m in rest:
            first.setdefault((m.topic() or "", m.partition() or 0), m.offset() or 0)
        for (topic, partition), offset in first.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))

    def rewind(self) -> None:
        """After an aborted transaction: the committed state of every owned partition, and the consumer
        back at the committed offsets."""
        assignment = self.consumer.assignment()
        owned = sorted(tp.partition for tp in assignment if tp.topic == self.state_topic)
        for p in owned:
            self.drop(p)
        self._restore(owned)
        for tp in self.consumer.committed(assignment, timeout=30):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    def check(self) -> None:
        """Raise FatalClientError if the consumer or the producer reported a fatal error."""
        self.fatal.raise_if_any()
        self.producer.check()

    def close(self) -> None:
        """Let go of both clients. Never raises (it runs on the way out after errors)."""
        self.producer.close()
        try:
            self.consumer.close()
        except (KafkaException, RuntimeError) as e:
            log.warning("could not close the consumer cleanly: %s", e, extra={"stage": self.name})

    # --- rebalances (called inside consume(), between transactions) -----------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._restore(sorted(tp.partition for tp in partitions if tp.topic == self.state_topic))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic == self.state_topic:
                self.drop(tp.partition)

    def _restore(self, parts: list[int]) -> None:
        if not parts:
            return
        start = time.monotonic()
        # The broker aborts a dead worker's transaction at most ~10 s after its timeout.
        tables = read_table(self.settings.common.kafka_bootstrap, self.changelog, parts,
                            timeout_s=self.settings.restore_timeout_s,
                            settle_s=self.settings.transaction_timeout_s + 15.0)
        for p in parts:
            self.load(p, tables[p])
        log.info("restored state from the changelog",
                 extra={"stage": self.name, "partitions": parts, "keys": sum(len(t) for t in tables.values()),
                        "seconds": round(time.monotonic() - start, 3)})


def _positions(msgs: Sequence[Message]) -> list[tuple[tuple[str, int], int]]:
    return [((m.topic() or "", m.partition() or 0), m.offset() or 0) for m in msgs]


def _usable(m: Message) -> bool:
    err = m.error()
    if err is None:
        return True
    if err.fatal() or err.code() == KafkaError._FATAL:
        # consume() hands a fatal error over once, as _FATAL (whose fatal() is False), then nothing
        # ever again: logging it and polling on would leave a live process that grades nothing.
        raise FatalClientError(f"consumer: {err.str()}")
    if err.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
        raise RuntimeError(f"another kind of consumer is in this group ({err.str()}): stop the faust workers "
                           "before starting native ones (APPRENTICE_GRADER_RUNTIME)")
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("consumer error (retried by librdkafka): %s", err)
    return False
