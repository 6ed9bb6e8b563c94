"""Interactions + FeedbackEvents (Kafka) --> GradedInteractions (Kafka): the grader on confluent-kafka.

    interactions, feedback, <app>-join --GradeStage--> graded, deadletter, <app>-join (other workers'
                                                       items), <app>-judge, <app>-pending-changelog
    <app>-judge --JudgeStage (own thread, only when a task has an LLM judge)--> <app>-join

One consumer group (the app id, as under faust) reads the sources and the join topic; the worker that
owns join partition p owns the states of p (`StateStore`, restored from partition p of the changelog).
Each batch is one Kafka transaction (stage.py, txn.py), which is the whole exactly-once argument:

- the batch's graded records, dead letters, forwarded join items, judge items, the new versions of
  the states it changed, and the consumer offsets past every record it read, commit atomically;
- a crash (or an aborted transaction) before the commit leaves none of it: readers of the graded
  topic (read_committed) never see the batch's records, the changelog never holds its states, and
  the offsets still point at its first records, which are processed again against the committed state
  and produce the same revisions with the same deterministic event ids, once;
- a crash after the commit leaves all of it, and nothing is processed twice;
- duplicates *in the input* (the same event id twice) are absorbed by the join state machine;
- a restarted worker takes its old transactional id (identity.py), which aborts the transaction it
  left open, so readers are not held back until the transaction timeout;
- a fatal client error (fenced producer or static consumer, which librdkafka never recovers from) makes
  the worker exit with status 1 rather than live on with dead clients; its supervisor restarts it, and
  the restart is the kill -9 case above. Closing is bounded (CLOSE_S): a client that hangs on the way
  out cannot keep the process alive either.

Everything between the Kafka calls is the same code as under faust: routing.py, join.py (the state
machine), components.py, detectors.py, judge_groups.py.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import Message

from services.grader import metrics as M
from services.grader.batch import BatchGrader, Outputs
from services.grader.bundles import encode_bundles, partition_for
from services.grader.changelog import ensure_internal_topics
from services.grader.config import GraderSettings
from services.grader.detectors import DetectorStats
from services.grader.identity import claim_identity
from services.grader.join import Joiner
from services.grader.judge_client import JudgeBackend
from services.grader.limits import limits_of
from services.grader.routing import DEADLETTER_HEADERS, GRADED_HEADERS
from services.grader.rulebook import RuleBook
from services.grader.stage import AfterCommit, TxnStage
from services.grader.state import SEQ_KEY_PREFIX, PendingState
from services.grader.store import StateStore
from services.grader.txn import FatalClientError
from shared.grading import GraderConfig

log = logging.getLogger(__name__)

CLOSE_S = 30.0
"""Longest wait for the judge thread and for the clients to close when the worker stops; past it the
process exits at once (the broker aborts what is left open, as after a kill -9)."""


class GradeStage(TxnStage):
    """Sources and join bundles --> graded records (the hot path)."""

    def __init__(self, settings: GraderSettings, joiner: Joiner, member: str) -> None:
        topics = settings.common.topics
        super().__init__(settings, name="grade", group=settings.app_name, state_topic=settings.join_topic,
                         topics=[topics.interactions, topics.feedback, settings.join_topic],
                         changelog=settings.pending_changelog, member=member, batch_max=settings.batch_max,
                         poll_s=settings.batch_within_s)
        self.joiner = joiner
        self.store = StateStore(joiner.due)
        self.batch = BatchGrader(joiner, self.store, interactions_topic=topics.interactions,
                                 join_topic=settings.join_topic, partitions=settings.partitions)
        self.out_topics = (topics.graded, topics.deadletter)
        self._next_tick = 0.0
        self._rules_seen = joiner.book.revision
        point, _, count = settings.fault_injection.partition(":")
        self._fault = (point, int(count)) if point else None
        self._emitting_batches = 0

    def load(self, partition: int, table: dict[bytes, bytes]) -> None:
        self.store.load(partition, _states(partition, table))

    def drop(self, partition: int) -> None:
        self.store.drop(partition)

    def process(self, msgs: Sequence[Message], now: float) -> AfterCommit | None:
        out = Outputs()
        add = self.batch.add
        for m in msgs:
            add(m, out, now)
        if now >= self._next_tick:
            if self._rules_seen != self.joiner.book.revision:  # a rule set or deleted at run time
                self._rules_seen = self.joiner.book.revision
                n = self.store.retick_open(now)
                log.info("grading rules changed; looking at every open window again", extra={"open": n})
            self.batch.tick(out, now)
            self._next_tick = now + self.settings.tick_interval_s
            M.PENDING.set(self.store.open_windows)
            M.export_stats(self.joiner.stats)
            M.export_waiting(self.store.waiting, self.joiner)
        if not out:
            for (kind, outcome), n in out.events.items():  # duplicates only: nothing to commit
                M.count_event(kind, outcome, n)
            return None
        self._write(out)
        graded = out.graded
        if graded:
            self._emitting_batches += 1
            if self._fault == ("after_state", self._emitting_batches):
                self.producer.flush()  # the batch's records are in the log, its transaction still open
                _crash("after_state")

        def after() -> None:
            for (kind, outcome), n in out.events.items():
                M.count_event(kind, outcome, n)
            for rec in graded:
                M.count_emitted(rec)
            if graded and self._fault == ("after_emit", self._emitting_batches):
                _crash("after_emit")
        return after

    def _write(self, out: Outputs) -> None:
        produce, s = self.producer.produce, self.settings
        for p, items in out.hops.items():
            for bundle in encode_bundles(items, self.joiner.limits.max_record_bytes):
                produce(s.join_topic, None, bundle, p)
        for group, item in out.judge:
            produce(s.judge_topic, group, item, partition_for(group, s.partitions))
        changelog = s.pending_changelog
        for iid, (p, state) in out.states.items():
            produce(changelog, iid.encode(), (out.blobs.get(iid) or state.encode()) if state is not None else None, p)
        graded, deadletter = self.out_topics
        for rec in out.graded:
            produce(graded, rec.interaction.session_id.encode() or None, rec.SerializeToString(),
                    headers=GRADED_HEADERS)
        for _original_key, letter in out.dead:
            produce(deadletter, letter.original_key or None, letter.SerializeToString(), headers=DEADLETTER_HEADERS)


def _states(partition: int, table: dict[bytes, bytes]) -> Iterator[tuple[str, PendingState]]:
    """The decodable states of a restored partition (faust's confirmation keys are not states). An
    undecodable value is skipped with an error, rather than stopping the worker at every start."""
    for key, value in table.items():
        if key.startswith(SEQ_KEY_PREFIX.encode()):
            continue
        try:
            yield key.decode(errors="replace"), PendingState.decode(value)
        except Exception as e:  # noqa: BLE001 - any malformed value (JSON, lengths, fields)
            log.error("skipping an unreadable state in the changelog",
                      extra={"partition": partition, "key": key[:200].decode(errors="replace"), "error": str(e)})


def _crash(point: str) -> None:
    log.warning("fault injection: exiting abruptly", extra={"point": point})
    os._exit(137)


class NativeRuntime:
    """The native grader's handle (shared/service.py). The stages run on a worker thread and the main
    thread only waits, so that a stop signal is acted on at once: a signal handler runs on the main thread
    between bytecodes, and a main thread blocked in a Kafka call (a commit waiting out a failing broker,
    30 s per try) would not see it. The worker ending by itself (a fatal client error, a failed stage)
    ends `wait` with exit code 1."""

    def __init__(self, settings: GraderSettings, config: GraderConfig, *, judge: JudgeBackend | None = None) -> None:
        self.settings = settings
        self.config = config
        self.joiner = Joiner(RuleBook(config), DetectorStats(config.detectors), retention_s=settings.retention_s,
                             orphan_feedback_s=settings.orphan_feedback_s, limits=limits_of(settings))
        self.judge = judge
        self._rules: Any = None
        self.stopping = threading.Event()
        self.failed = False
        self.code = 0
        """Exit status: 1 after a fatal client error or a stage that stopped on an error."""
        self._identity: Any = None
        self._worker: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        s = self.settings
        ensure_internal_topics(s)
        from services.grader.rules_follower import follow

        self._rules = follow(s, self.joiner.book)  # the runtime rules, read whole before any grading
        self._identity = claim_identity(s.app_id, s.instance_id, s.datadir)
        log.info("native grader starting", extra={"app_id": s.app_id, "worker": self._identity.name})
        self._worker = threading.Thread(target=self._work, args=(self._identity.name,), name="grader", daemon=True)
        self._worker.start()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the worker stopped or was told to."""
        return self.stopping.wait(timeout)

    @property
    def exit_code(self) -> int:
        return self.code

    def stop(self, grace: float | None = None) -> None:
        """Let the batch in progress end within `grace` (default: `shutdown_grace_s`); past it the process
        exits at once, as after kill -9."""
        self.stopping.set()
        if self._closed:
            return
        self._closed = True
        grace = self.settings.shutdown_grace_s if grace is None else grace
        if self._worker is not None:
            self._worker.join(grace)
            if self._worker.is_alive():
                # Safe: what the batch in progress wrote is in an open transaction, which the broker (or
                # this worker's restart, under the same transactional id) aborts; it is processed again then.
                log.error("the batch in progress did not end within the shutdown grace; exiting now, as after "
                          "kill -9", extra={"seconds": grace})
                logging.shutdown()
                os._exit(self.code)
        if self._rules is not None:
            self._rules.stop()
        if self._identity is not None:
            self._identity.release()

    def _work(self, member: str) -> None:
        """The grade stage (and the judge stage's thread) until `stop`; `code` says how it ended."""
        judge_thread = None
        grade = None
        code = 1
        try:
            grade = GradeStage(self.settings, self.joiner, member)
            if any(t.judges for t in self.config.tasks):
                judge_thread = threading.Thread(target=self._run_judge, args=(member,), name="judge",
                                                daemon=True)
                judge_thread.start()
            grade.run(self.stopping)
            code = 1 if self.failed else 0
        except FatalClientError as e:
            log.error("native grader stopping: a Kafka client is fenced or failed for good; exiting for a "
                      "restart with fresh clients", extra={"error": str(e)})
        except Exception:
            log.exception("native grader stopped on an error")
        finally:
            self.code = code
            self.stopping.set()
            closing = grade
            if not _within(CLOSE_S, lambda: _shut(judge_thread, closing)):
                log.error("the Kafka clients did not close in time; exiting now", extra={"seconds": CLOSE_S})
                logging.shutdown()
                os._exit(code or 1)

    def _run_judge(self, member: str) -> None:
        from services.grader.native_judge import JudgeStage

        try:
            stage = JudgeStage(self.settings, self.joiner, member, backend=self.judge)
            try:
                stage.run(self.stopping)
            finally:
                stage.close()
        except Exception:
            log.exception("judge stage stopped on an error; stopping the worker")
            self.failed = True
            self.stopping.set()


def _shut(judge_thread: threading.Thread | None, grade: GradeStage | None) -> None:
    if judge_thread is not None:
        judge_thread.join()
    if grade is not None:
        grade.close()


def _within(seconds: float, fn: Callable[[], None]) -> bool:
    """Run `fn` on a daemon thread; whether it finished within `seconds` (its errors are logged)."""
    def target() -> None:
        try:
            fn()
        except Exception:
            log.exception("error while stopping the native grader")
    t = threading.Thread(target=target, name="grader-close", daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()
