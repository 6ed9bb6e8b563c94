"""Judge items (key = group id) --> LLM judge results on the join topic: the native runtime's judge stage.

Runs in its own thread with its own consumer group (`<app>-judge`) and transactional producer, so that
judge calls (seconds each) never hold up grading. Groups live in memory and in the compacted
`judge-groups` changelog (judge_groups.py decides when a group is complete). Per batch: apply the
arrivals, take the complete and the overdue groups, call the judge for them (concurrently, before
the transaction starts), then commit their results, the group table changes and the offsets in one
transaction. A crash before the commit calls the judge again for the same groups; the pending table
keeps the first result per (interaction, judge grader), so a repeated call changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence

from confluent_kafka import Message

from services.grader import metrics as M
from services.grader.batch import SOURCE
from services.grader.bundles import encode_bundle, partition_for
from services.grader.config import GraderSettings
from services.grader.join import INTERACTION, Joiner, Rejected
from services.grader.judge_client import JudgeBackend, judge_group, make_judge_backend
from services.grader.judge_groups import JudgeGroup, add_member, due, judge_items
from services.grader.routing import dead_letter
from services.grader.stage import AfterCommit, TxnStage
from shared.grading import TaskGraders
from shared.kafka.busy import call_while_polling
from shared.proto.apprentice.v1 import events_pb2

log = logging.getLogger(__name__)

BATCH = 32
"""Judge items per batch: each complete group costs a judge call. The calls of a batch run while the
consumer keeps polling, paused (`_judge`), so a slow judge delays the batch without costing the
membership; they must still end within the transaction timeout."""


class JudgeStage(TxnStage):
    def __init__(self, settings: GraderSettings, joiner: Joiner, member: str, *,
                 backend: JudgeBackend | None = None) -> None:
        super().__init__(settings, name="judge", group=f"{settings.app_name}-judge", topics=[settings.judge_topic],
                         state_topic=settings.judge_topic, changelog=settings.judge_changelog, member=member,
                         batch_max=BATCH, poll_s=0.2)
        self.joiner = joiner
        self.backend = backend or make_judge_backend(settings.judge_backend, endpoint=settings.inference_endpoint,
                                                     tenant=settings.judge_tenant)
        self.groups: dict[int, dict[bytes, JudgeGroup]] = {}
        self.due: dict[bytes, tuple[float, int]] = {}
        self.loop = asyncio.new_event_loop()

    def load(self, partition: int, table: dict[bytes, bytes]) -> None:
        self.drop(partition)
        groups = self.groups[partition] = {k: JudgeGroup.decode(v) for k, v in table.items()}
        for key, group in groups.items():
            self.due[key] = (due(group, self._task(group)), partition)

    def drop(self, partition: int) -> None:
        for key in self.groups.pop(partition, {}):
            self.due.pop(key, None)

    def close(self) -> None:
        try:
            if not self.loop.is_running():  # still running: judge calls abandoned at stop (their thread ends alone)
                self.loop.run_until_complete(self.backend.close())
                self.loop.close()
        finally:
            super().close()

    def process(self, msgs: Sequence[Message], now: float) -> AfterCommit | None:
        writes: dict[bytes, tuple[int, JudgeGroup | None]] = {}
        ready: list[list[events_pb2.Interaction]] = []
        dead: list[tuple[bytes | None, events_pb2.DeadLetter]] = []
        for m in msgs:
            try:
                self._arrive(m, now, writes, ready)
            except Exception as e:  # noqa: BLE001 - the judge stage must keep going
                log.exception("judge stage failed on a record")
                dead.append((m.key(), dead_letter(Rejected("grader.judge", f"{type(e).__name__}: {e}",
                                                           type(e).__name__), source=SOURCE, topic=m.topic() or "",
                                                  partition=m.partition() or 0, offset=m.offset() or 0,
                                                  key=m.key(), value=m.value())))
        for key, (when, p) in list(self.due.items()):
            if when <= now:
                ready.append(self.groups[p].pop(key).interactions())
                del self.due[key]
                writes[key] = (p, None)
        items = self._judge(ready) if ready else {}
        produce, s = self.producer.produce, self.settings
        for p, batch in items.items():
            produce(s.join_topic, None, encode_bundle(batch), p)
        for group_key, (p, group) in writes.items():
            produce(s.judge_changelog, group_key, group.encode() if group is not None else None, p)
        for original_key, letter in dead:
            M.DEADLETTERS.labels("grader.judge").inc()
            produce(s.common.topics.deadletter, original_key, letter.SerializeToString())
        return None

    def _arrive(self, m: Message, now: float, writes: dict[bytes, tuple[int, JudgeGroup | None]],
                ready: list[list[events_pb2.Interaction]]) -> None:
        p, key, value = m.partition() or 0, m.key() or b"", m.value() or b""
        groups = self.groups[p]
        if value[:1] != INTERACTION:  # a tick written by the faust runtime: judge what has arrived
            group = groups.pop(key, None)
            if group is not None:
                ready.append(group.interactions())
                self.due.pop(key, None)
                writes[key] = (p, None)
            return
        it = events_pb2.Interaction.FromString(value[1:])
        task = self.joiner.task_for(it)
        step = add_member(groups.get(key), it, value[1:], task, now)
        if step.ready:
            ready.append(step.ready)
        if step.group is None:
            groups.pop(key, None)
            self.due.pop(key, None)
        else:
            groups[key] = step.group
            self.due[key] = (due(step.group, task), p)
        if step.changed:
            writes[key] = (p, step.group)

    def _judge(self, ready: list[list[events_pb2.Interaction]]) -> dict[int, list[tuple[bytes, bytes]]]:
        """Every judge grader of every ready group, called concurrently; results as join items by partition."""
        calls = []
        for members in ready:
            task = self.joiner.task_for(members[0])
            for spec in task.judges if task is not None else []:
                calls.append((spec, judge_group(self.backend, spec, members)))

        async def all_calls() -> list[list[tuple[bytes, bytes]]]:
            results = await asyncio.gather(*(c for _, c in calls))
            return [judge_items(spec, scores) for (spec, _), scores in zip(calls, results, strict=True)]

        # A slow or restarting judge must not cost the group membership: the calls run on a worker thread
        # while this thread keeps polling with every partition paused (shared/kafka/busy.py).
        results = call_while_polling(self.consumer, lambda: self.loop.run_until_complete(all_calls()),
                                     group=self.name, stop=self._stop, name="grader-judge-calls")
        items: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
        for per_spec in results:
            for key, value in per_spec:
                items[partition_for(key, self.settings.partitions)].append((key, value))
        return items

    def _task(self, group: JudgeGroup) -> TaskGraders | None:
        members = group.interactions()[:1]
        return self.joiner.task_for(members[0]) if members else None
