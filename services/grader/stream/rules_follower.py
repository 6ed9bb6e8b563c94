"""The runtime-rules topic --> the RuleBook of this worker (confluent-kafka, own thread).

Every worker reads `apprentice.grader-rules.v1` whole, from its beginning (no consumer group: each worker
needs every rule), before it grades anything (`start` returns once it has reached the end it saw), then
follows it on a daemon thread. A record is checked for who wrote it (a valid record signature by the
`operator` principal, shared/kafka/trust.py, monotonic per key) and then by rulebook.py: a good one changes the RuleBook
(the joiner notices the new revision; the ticker, stream/ticker.py, then ticks every open window so
that the new windows and graders apply to interactions already waiting); a refused one changes nothing and goes to the
dead-letter topic (stage `grader.rules`). Refused records met while catching up at start are only
logged: they were dead-lettered when they were written, and every restart would repeat the letter.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, Producer, TopicPartition

from services.grader import metrics as M
from services.grader.core.join import Rejected
from services.grader.core.routing import DEADLETTER_HEADERS, dead_letter
from services.grader.core.rulebook import RuleBook, RuleRefused, parse_record
from services.grader.settings import GraderSettings
from shared.contracts.topics import contract_name
from shared.contracts.validation import KafkaHeaders
from shared.kafka.consumers import new_consumer
from shared.kafka.durability import durable_producer
from shared.kafka.reader import ReadTimeout, TopicMissing, read_to_end
from shared.kafka.security import librdkafka_config
from shared.kafka.trust import RecordTrust, record_signer

log = logging.getLogger(__name__)

STAGE = "grader.rules"


class RulesFollower:
    def __init__(self, settings: GraderSettings, book: RuleBook) -> None:
        self.settings = settings
        self.book = book
        self.topic = settings.common.topics.grader_rules
        common = settings.common
        self._security = librdkafka_config(common)
        self._consumer = new_consumer(common.kafka_bootstrap, purpose="grader-rules", security=common,
                                      group_id=common.topics.group_id(f"{settings.app_name}-rules-reader"))
        self._producer: Producer | None = None
        self._signer = record_signer(common, "grader")
        # monotonic: an old rule record re-sent (say, a `set` after its `delete`) cannot bring it back
        self._trust = RecordTrust.from_settings(common, monotonic=True)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live = False

    def start(self, timeout_s: float = 30.0) -> None:
        """Read the topic up to its current end (at most `timeout_s`), then follow it on a thread."""
        try:
            for m in read_to_end(self._consumer, self.topic, timeout_s=timeout_s):
                self._handle(m)
        except ReadTimeout as e:
            # the consumer stays assigned: the follower below reads on from where this stopped
            log.warning("runtime grading rules not read to their end at start; going on: %s", e,
                        extra={"topic": self.topic})
        except TopicMissing as e:
            log.warning("runtime grading rules topic missing at start; following its partition 0: %s", e,
                        extra={"topic": self.topic})
            self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._live = True
        log.info("runtime grading rules read", extra={"rules": len(self.book.rules()), "topic": self.topic})
        self._thread = threading.Thread(target=self._run, name="grader-rules", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for m in self._consumer.consume(100, 0.5):
                    self._handle(m)
            except Exception:  # noqa: BLE001 - the follower must outlive a bad record or a broker hiccup
                log.exception("following the grading rules failed; retrying")
                self._stop.wait(1.0)

    def _handle(self, m: Message) -> None:
        err = m.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("rules consumer error: %s", err)
            return
        verdict = self._trust.verdict(m.topic() or "", m.key(), m.value(), m.headers(),
                                      partition=m.partition(), offset=m.offset())
        if not verdict.ok:
            self._refuse(m, f"untrusted record: {verdict.reason}")
            return
        # with signatures off (insecure, SECURITY.md) there is no signer, so no rule is applied
        try:
            rec = parse_record(m.key(), m.value(), signer=verdict.principal)
        except RuleRefused as e:
            self._refuse(m, str(e))
            return
        if self.book.apply(rec):
            log.info("grading rule deleted" if rec.deleted else "grading rule set",
                     extra={"tenant": rec.tenant, "task": rec.task, "revision": rec.revision,
                            "operator": rec.operator, "live": self._live})

    def _refuse(self, m: Message, reason: str) -> None:
        log.warning("refused a grading rule record", extra={"reason": reason[:500], "live": self._live,
                                                            "origin": f"{m.topic()}/{m.partition()}@{m.offset()}"})
        if not self._live:
            return
        tenant = (m.key() or b"").decode(errors="replace").partition("/")[0] or "unknown"
        letter = dead_letter(Rejected(STAGE, reason, "RuleRefused", tenant), source="grader", topic=m.topic() or "",
                             partition=m.partition() or 0, offset=m.offset() or 0, key=m.key(), value=m.value())
        if self._producer is None:
            self._producer = durable_producer({**self._security,
                                               "bootstrap.servers": self.settings.common.kafka_bootstrap})
        topic, value, key = self.settings.common.topics.deadletter, letter.SerializeToString(), letter.original_key or None
        headers: KafkaHeaders = list(DEADLETTER_HEADERS)
        if self._signer is not None:  # the grader's dead letters carry its signature (shared/kafka/signing.py)
            headers = [*self._signer.headers(contract_name(topic) or topic, key, value, headers)]
        self._producer.produce(topic, value, key, headers=headers)
        self._producer.flush(10)
        M.DEADLETTERS.labels(STAGE).inc()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(Exception):  # on the way out
            self._consumer.close()
        if self._producer is not None:
            self._producer.flush(5)


def follow(settings: GraderSettings, book: RuleBook) -> Any:
    """Start a follower for `book` (catch-up first); the caller stops it on the way out."""
    f = RulesFollower(settings, book)
    f.start()
    return f
