"""What the faust stages (route, grade, judge, ticker, recovery) need of the app they run in: a Protocol.

The stages are typed against `StageContext`, not against `GraderApp` (app.py), so that app.py, which
builds the stages, is the only module of stream/ that knows the whole app (service.py builds it in
turn), and nothing imports back up. What a stage may touch is listed here and nothing more: the
settings, the join core, the two tables and the in-memory due indexes beside them, the ways to send,
and the few facts about the faust worker the ticker reads. A test can hand a stage a small fake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Mapping
from typing import Any, Protocol

from faust.types import TP, ConsumerT, EventT, TableT

from services.grader.core.detectors import DetectorStats
from services.grader.core.join import Joiner
from services.grader.core.waiting import WaitingIndex
from services.grader.settings import GraderSettings
from shared.contracts.validation import KafkaHeaders
from shared.kafka.trust import RecordTrust

JoinItems = dict[int, list[tuple[bytes, bytes]]]
"""Join items by join partition: (interaction id, kind byte + payload)."""

DueIndex = dict[bytes, tuple[float, bool, int]]
"""Interaction id -> (next time the ticker must look at it, window still open, join partition)."""


class Settler(Protocol):
    """The emission recovery (recovery.py) as the grade stage and the ticker use it."""

    lock: asyncio.Lock
    """Orders a settle with grade batches (both touch the `pending` table)."""
    settled: set[int]
    """Join partitions settled since this worker got them."""

    def next_seq(self) -> int: ...

    def forget(self, parts: Collection[int]) -> None: ...

    async def settle_new(self, parts: Collection[int]) -> None: ...


class StageContext(Protocol):
    """What every stage shares; GraderApp (app.py) implements it."""

    settings: GraderSettings
    joiner: Joiner
    stats: DetectorStats
    topic_names: Mapping[str, str]
    """The contract topics by role: interactions, feedback, graded, deadletter."""
    table: TableT[bytes, bytes]
    """`pending`: interaction id -> join state (core/state.py); owned by the grade stage."""
    judge_table: TableT[bytes, bytes]
    """`judge-groups`: group id -> judge group (core/judge_groups.py); owned by the judge stage."""
    due: DueIndex
    waiting: WaitingIndex
    """The open windows by tenant and task (core/waiting.py), kept beside `due`."""
    judge_due: dict[bytes, float]
    """Judge group key -> when the ticker must close it."""
    recovery: Settler
    trust: RecordTrust
    """The check of who wrote each source record (shared/kafka/trust.py); route.py applies it."""

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
                   headers: KafkaHeaders | None = None) -> Awaitable[Any]:
        """Hand a record to the producer; the returned future resolves once Kafka acknowledged it."""
        ...

    async def dead_letter(self, ev: EventT, stage: str, reason: str, error_type: str, tenant: str = "unknown", *,
                          key: bytes | None = None, value: bytes | None = None) -> Awaitable[Any]:
        """A DeadLetter for `ev` (or for one item `key`/`value` of its join bundle), tagged with the stage."""
        ...

    async def send_bundles(self, topic: str, items: JoinItems) -> list[Awaitable[Any]]:
        """Join items as bundle records (core/bundles.py), one or more per partition."""
        ...

    def add_join_item(self, items: JoinItems, key: bytes, value: bytes) -> None:
        """Queue one join item under its join partition (by key, as Kafka's default partitioner)."""

    def changelog_name(self, table: TableT[bytes, bytes]) -> str: ...

    def active_partitions(self, topic: str) -> set[int]:
        """The partitions of `topic` this worker is active for."""
        ...

    def assigned(self, topics: Collection[str]) -> list[TP]:
        """The partitions of `topics` this worker is active for, as faust's topic-partitions."""
        ...

    @property
    def consumer(self) -> ConsumerT:
        """faust's consumer (the ticker's stall repair seeks and resumes with it)."""
        ...

    @property
    def stopping(self) -> bool:
        """The worker is shutting down."""
        ...

    @property
    def ready(self) -> bool:
        """The tables are restored and no rebalance is in progress: partitions may be settled."""
        ...
