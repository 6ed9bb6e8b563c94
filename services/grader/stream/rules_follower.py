"""The runtime-rules topic --> the RuleBook of this worker (confluent-kafka, own thread).

Every worker reads `apprentice.grader-rules.v1` whole, from its beginning (no consumer group: each worker
needs every rule), before it grades anything (`start` returns once it has reached the end it saw), then
follows it on a daemon thread. A record is checked by rulebook.py: a good one changes the RuleBook
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
from shared.kafka.consumers import new_consumer
from shared.kafka.reader import ReadTimeout, TopicMissing, read_to_end
from shared.kafka.security import librdkafka_config
from shared.security.identity import Role
from shared.security.keys import KeyRing

log = logging.getLogger(__name__)

STAGE = "grader.rules"


def operator_digests(settings: GraderSettings) -> list[tuple[str, bytes]] | None:
    """(key id, SHA-256 of the key) of every operator key of the stack's key ring; None without one."""
    common = settings.common
    if not (common.auth_keys.get_secret_value() or common.auth_keys_file):
        return None

    ring = KeyRing.from_text(common.auth_keys.get_secret_value(), file=common.auth_keys_file)
    return [(e.identity.key_id, e.digest) for e in ring.entries() if e.identity.role is Role.OPERATOR and e.digest]


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
        try:
            rec = parse_record(m.key(), m.value(), operator_digests=operator_digests(self.settings))
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
            self._producer = Producer({**self._security, "bootstrap.servers": self.settings.common.kafka_bootstrap})
        self._producer.produce(self.settings.common.topics.deadletter, letter.SerializeToString(),
                               letter.original_key or None, headers=DEADLETTER_HEADERS)
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
