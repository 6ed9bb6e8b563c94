"""Interactions + FeedbackEvents (Kafka) --> GradedInteractions (Kafka): the grader's faust app.

The stages apply the pure grading core (services/grader/core/: routing.py, join.py, components.py,
detectors.py, judge_groups.py). One faust app (id = topic prefix + `apprentice-grader`) with three agents and a timer:

    interactions, feedback --route--> <app>-join --grade--> graded (key = session id)
                                  \\--> <app>-judge (key = group id) --judge--> <app>-join (judge results)
    ticker (every tick_interval_s): due windows / retention --> tick items on <app>-join

This module wires them: the faust app, its topics and tables, and what every stage sends through
(`send`, `dead_letter`, `send_bundles`). `GraderApp` implements context.py's `StageContext`, the one
interface the stages see (they never import this module). The stages: route.py, grade.py (owns the
`pending` table: the three acknowledged phases of each batch), judge.py, ticker.py; after a crash or a
rebalance, recovery.py settles the emissions left in doubt (the emission markers), looking them up with
event_scan.py. patches.py holds every repair of faust's own consumer and producer. Why this adds up to
an exactly-once effect: services/grader/README.md, "Exactly-once effect".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection, Mapping
from typing import Any

import faust
from faust.types import TP, ConsumerT, EventT, TableT

from services.grader import metrics as M
from services.grader.core.bundles import encode_bundles, partition_for
from services.grader.core.detectors import DetectorStats
from services.grader.core.join import Joiner, Rejected
from services.grader.core.routing import DEADLETTER_HEADERS, dead_letter
from services.grader.core.rulebook import RuleBook
from services.grader.core.waiting import WaitingIndex
from services.grader.settings import GraderSettings
from services.grader.stream import patches as faust_patches
from services.grader.stream.context import DueIndex, JoinItems, Settler
from services.grader.stream.grade import GradeStage
from services.grader.stream.judge import JudgeStage
from services.grader.stream.judge_client import JudgeBackend
from services.grader.stream.recovery import EmissionRecovery
from services.grader.stream.route import RouteStage
from services.grader.stream.ticker import Ticker
from shared.contracts.topics import contract_name
from shared.contracts.validation import KafkaHeaders
from shared.grading import GraderConfig
from shared.kafka.security import faust_credentials
from shared.kafka.trust import RecordTrust, record_signer

faust_patches.install()  # before any faust app of this process exists

log = logging.getLogger(__name__)

SOURCE = "grader"

def _brokers(bootstrap: str) -> list[str]:
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


class GraderApp:
    """The faust app and what its stages share (context.py `StageContext`): topics, tables, the due
    index, and the ways to send."""

    def __init__(self, settings: GraderSettings, config: GraderConfig, *,
                 judge: JudgeBackend | None = None, book: RuleBook | None = None) -> None:
        self.settings = settings
        self.config = config
        topics = settings.common.topics
        self.stats = DetectorStats(config.detectors)
        self.joiner = Joiner(book or RuleBook(config), self.stats, retention_s=settings.retention_s,
                             orphan_feedback_s=settings.orphan_feedback_s, source=SOURCE, limits=settings.limits())
        self.due: DueIndex = {}
        self.waiting = WaitingIndex()
        """The open windows by tenant and task (waiting.py), kept beside `due`."""
        self.judge_due: dict[bytes, float] = {}
        """judge group key -> when the ticker must close it."""
        self.signer = record_signer(settings.common, SOURCE)
        """Signs every record `send` writes to an Apprentice topic (graded, dead letters); None when off."""
        self.trust = RecordTrust.from_settings(settings.common)
        """Who may have written each source record (route.py checks it before decoding): interactions
        only from inference, feedback only from its writers (shared/contracts/topic_access.py), and a
        signature already accepted at another offset (a replayed feedback) refused."""

        settings.datadir.mkdir(parents=True, exist_ok=True)
        P = settings.join_partitions
        self.app = faust.App(
            settings.app_id, broker=_brokers(settings.common.kafka_bootstrap), store=settings.store,
            broker_credentials=faust_credentials(settings.common),  # TLS / SASL, as every Kafka client
            datadir=str(settings.datadir / settings.app_id), web_enabled=False, autodiscover=False,
            topic_partitions=P, topic_replication_factor=settings.replication or 1,   # resolved at start (internal_topics.py)
            key_serializer="raw", value_serializer="raw", consumer_auto_offset_reset="earliest",
            consumer_max_fetch_size=4 * 1024 * 1024, stream_buffer_maxsize=max(4096, 4 * settings.batch_max),
            broker_commit_every=max(1000, settings.batch_max), broker_commit_interval=settings.commit_interval_s,
            producer_acks=-1, producer_linger=0.005, table_standby_replicas=0,
            broker_session_timeout=settings.session_timeout_s,
            broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 4),
            broker_max_poll_interval=settings.max_poll_interval_s,
            consumer_group_instance_id=settings.instance_id or None)
        app = self.app
        raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                               "value_serializer": "raw"}
        self.source_topic = app.topic(topics.interactions, topics.feedback, **raw)
        self.join_topic = app.topic(settings.join_topic, partitions=P, internal=True, **raw)
        self.judge_topic = app.topic(settings.judge_topic, partitions=P, internal=True, **raw)
        self.topic_names: Mapping[str, str] = {"interactions": topics.interactions, "feedback": topics.feedback,
                            "graded": topics.graded, "deadletter": topics.deadletter}
        # Keys and values are raw bytes (the app's serializers): states are encoded by state.py.
        self.table: TableT[bytes, bytes] = app.Table("pending", partitions=P, key_type=bytes, value_type=bytes)
        self.judge_table: TableT[bytes, bytes] = app.Table("judge-groups", partitions=P, key_type=bytes,
                                                           value_type=bytes)

        self.recovery: Settler = EmissionRecovery(self)
        self.route = RouteStage(self)
        self.grade = GradeStage(self)
        self.judge = JudgeStage(self, judge)
        self.ticker = Ticker(self)
        app.on_partitions_revoked.connect(self._on_partitions_revoked)  # type: ignore[arg-type]
        app.agent(self.source_topic, name="route")(self.route.agent)
        app.agent(self.join_topic, name="grade")(self.grade.agent)
        app.agent(self.judge_topic, name="judge")(self.judge.agent)
        app.task(self.ticker.run)

    # --- what every stage sends through ----------------------------------------------------------
    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   partition: int | None = None, headers: KafkaHeaders | None = None) -> Awaitable[Any]:
        """Hand a record to the producer; the returned future resolves when Kafka acknowledged it.
        `headers`: the value's type (shared/contracts/validation.py) on the graded and dead-letter topics.
        The one place the grader's stages write records, so the one place they are signed: a record to an
        Apprentice topic carries the grader's signature (shared/kafka/signing.py); internal topics and
        changelogs (read only by this app) are left unsigned."""
        base = contract_name(topic)
        if self.signer is not None and base is not None:
            headers = [*self.signer.headers(base, key, value, headers)]
        return await self.app.producer.send(topic, key, value, partition, None, headers)  # type: ignore[arg-type]  # bytes values

    async def dead_letter(self, ev: EventT, stage: str, reason: str, error_type: str,
                          tenant: str = "unknown", *, key: bytes | None = None,
                          value: bytes | None = None) -> Awaitable[Any]:
        """DeadLetter for `ev` (or for one item `key`/`value` of a join bundle), tagged with the stage."""
        msg = ev.message
        key = ev.key if key is None else key
        value = ev.value if value is None else value
        dl = dead_letter(Rejected(stage, reason, error_type, tenant), source=SOURCE, topic=msg.topic,
                         partition=msg.partition, offset=msg.offset, key=key, value=value)
        M.DEADLETTERS.labels(stage).inc()
        log.warning("dead-lettered record", extra={"stage": stage, "reason": reason[:300],
                                                    "origin": f"{msg.topic}/{msg.partition}@{msg.offset}"})
        return await self.send(self.topic_names["deadletter"], dl.original_key or None, dl.SerializeToString(),
                               headers=DEADLETTER_HEADERS)

    async def send_bundles(self, topic: str, items: JoinItems) -> list[Awaitable[Any]]:
        """Join items as bundle records (join.py), one or more per partition."""
        limit = self.joiner.limits.max_record_bytes
        return [await self.send(topic, None, bundle, p) for p, batch in sorted(items.items())
                for bundle in encode_bundles(batch, limit)]

    def add_join_item(self, items: JoinItems, key: bytes, value: bytes) -> None:
        items.setdefault(partition_for(key, self.settings.join_partitions), []).append((key, value))

    @staticmethod
    def changelog_name(table: TableT[bytes, bytes]) -> str:
        return str(table.changelog_topic.get_topic_name())

    def active_partitions(self, topic: str) -> set[int]:
        return {tp.partition for tp in self.assigned((topic,))}

    def assigned(self, topics: Collection[str]) -> list[TP]:
        return [tp for tp in self.app.assignor.assigned_actives() if tp.topic in topics]

    @property
    def consumer(self) -> ConsumerT:
        return self.app.consumer

    @property
    def stopping(self) -> bool:
        return bool(self.app.should_stop)

    @property
    def ready(self) -> bool:
        recovered = self.app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]
        return bool(recovered and not self.app.rebalancing)

    async def _on_partitions_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        """(faust signal receiver) A partition that leaves this worker must be settled again if it ever
        comes back: another worker may have crashed with emissions in doubt on it meanwhile."""
        gone = {tp.partition for tp in revoked if tp.topic == self.settings.join_topic}
        self.recovery.forget(gone)
        for key in [k for k, (_d, _o, p) in self.due.items() if p in gone]:
            del self.due[key]
            self.waiting.discard(key.decode(errors="replace"))
