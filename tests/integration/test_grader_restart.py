"""Crash recovery against the real broker: kill -9 mid-stream, abrupt exits at the
two points where an emission is in doubt, then a restart; windows that must still close after one.

In every case each (interaction, revision) must reach the graded topic exactly once, nothing may be
missing, and the join state must survive (a feedback event after the restart revises a record graded
before the crash instead of grading it afresh). services/grader/README.md ("Exactly-once effect") says why.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import (
    GraderProcess,
    by_interaction,
    delete_namespace,
    feedback,
    graded,
    grader_env,
    interaction,
)
from tests.helpers.kafka import TopicReader
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")

IDLE_S = 90.0
"""A wait fails after this long without progress (a grader's log or the records read did not grow)."""


def wait_while_progressing(done: Callable[[], T | None], progress: Callable[[], Hashable], *, what: str,
                           idle_s: float = IDLE_S, step: Callable[[], None] = lambda: time.sleep(0.5),
                           tail: Callable[[], str] = lambda: "", max_s: float = 1800.0) -> T:
    """`done()` once it is not None (an exit status of 0 counts), waiting as `wait_for` does while
    `progress()` keeps changing (a log that grows, records that arrive: a loaded machine makes a grader
    slow, not stuck). `step()` runs between looks (a sleep, or polling a reader, which is then part of
    the progress)."""
    def ready() -> tuple[T] | None:
        result = done()
        if result is None:
            step()
            return None
        return (result,)

    return wait_for(ready, what=what, stall_s=idle_s, progress=progress, every=0.0, detail=tail, max_s=max_s)[0]


def log_size(*graders: GraderProcess) -> tuple[int, ...]:
    return tuple(g.log_path.stat().st_size if g.log_path.exists() else 0 for g in graders)


def tails(*graders: GraderProcess) -> str:
    return "\n".join(f"--- {g.log_path.name}, first errors\n{g.first_errors()}\n--- {g.log_path.name}\n{g.log_tail()}"
                     for g in graders)


def exit_code(g: GraderProcess, *others: GraderProcess, reader: TopicReader | None = None,
              what: str = "the grader's exit") -> int:
    """The exit status of `g`, waiting while it (or `others`) logs, or `reader` receives records."""
    assert g.proc is not None
    proc = g.proc
    seen = (lambda: len(reader.records)) if reader is not None else (lambda: 0)
    step = (lambda: reader.poll(0.3)) if reader is not None else (lambda: time.sleep(0.5))
    return wait_while_progressing(proc.poll, lambda: (seen(), *log_size(g, *others)), what=what, step=step,
                                  tail=lambda: tails(g, *others))


def records_until(reader: TopicReader, pred: Callable[[list], bool], *graders: GraderProcess, what: str,
                  parse: Callable[[bytes], object] | None = None) -> list:
    """The records of `reader` (parsed) once `pred` holds, waiting while records arrive or a grader logs.
    A grader that exits meanwhile fails the wait at once, with its exit status and first errors."""
    def done() -> list | None:
        for g in graders:
            if (gone := g.exited()) is not None:
                raise AssertionError(f"while waiting for {what}: {gone}")
        parsed = [parse(m.value()) if parse else m for m in reader.records]
        return parsed if pred(parsed) else None

    return wait_while_progressing(done, lambda: (len(reader.records), *log_size(*graders)), what=what,
                                  step=lambda: reader.poll(0.3), tail=lambda: tails(*graders))

CONFIG = """
version: restart-1
tasks:
  - tenant: demo
    task: support
    feedback_window_s: 600
    graders: [{name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}]
  - tenant: demo
    task: rules
    graders: [{name: has_number, type: regex, pattern: "[0-9]+"}]
"""


class Run:
    def __init__(self, bootstrap: str, home: Path, config: str = CONFIG) -> None:
        self.bootstrap = bootstrap
        self.topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
        ensure_topics(bootstrap, self.topics)
        self.home = home
        self.cfg = home / "grader.yaml"
        self.cfg.write_text(config)
        self.expected: set[str] = set()
        self.starts = 0

    def produce(self, n_rules: int, n_support: int, *, pace_s: float = 0.0,
                hold: tuple[int, threading.Event] | None = None) -> None:
        """Rules interactions (graded at once) and support interactions with their KPI, interleaved in
        chunks of 100, sleeping `pace_s` between chunks. `hold=(i, event)`: after the first `i` of each
        kind, wait for `event` before the rest, so the stream is still flowing at a kill however slow the
        machine makes the graders (a pace alone can end the stream before the kill)."""
        p = signed_producer(self.bootstrap, "inference")
        for i in range(max(n_rules, n_support)):
            if hold is not None and i == hold[0]:
                p.flush()
                assert hold[1].wait(600), "the producer was never released"
            if i < n_rules:
                it = interaction(task="rules", text=f"answer {i}", session_id=f"s{i % 50}")
                p.produce(self.topics.interactions, it.session_id, it)
                self.expected.add(it.interaction_id)
            if i < n_support:
                it = interaction(session_id=f"s{i % 50}")
                p.produce(self.topics.interactions, it.session_id, it)
                p.produce(self.topics.feedback, it.interaction_id, feedback(it.interaction_id, value=float(i % 2)))
                self.expected.add(it.interaction_id)
            if pace_s and i % 100 == 99:
                p.flush()
                time.sleep(pace_s)
        p.flush()

    def grader(self, **extra: str) -> GraderProcess:
        self.starts += 1
        env = grader_env(self.topics.prefix, self.bootstrap, self.cfg, self.home, log_json="true", **extra)
        env["APPRENTICE_LOG_JSON"] = "true"
        return GraderProcess(env, self.home / f"grader-{self.starts}.log").start()

    def check_exactly_once(self, reader: TopicReader, *graders: GraderProcess) -> list:
        """Waits while `graders` make progress (records arrive, their logs grow)."""
        records_until(reader, lambda rs: {r.interaction.interaction_id for r in rs} >= self.expected, *graders,
                      what=f"every one of {len(self.expected)} interactions graded", parse=graded)
        reader.poll(3.0)  # anything late would be a duplicate
        recs = [graded(m.value()) for m in reader.records]
        seen = {r.interaction.interaction_id for r in recs}
        assert seen >= self.expected, f"lost {len(self.expected - seen)} of {len(self.expected)}"
        dupes = [k for k, c in Counter(r.envelope.event_id for r in recs).items() if c > 1]
        assert not dupes, f"{len(dupes)} (interaction, revision) emitted twice"
        assert all(r.revision == 1 for r in recs)
        return recs


    def revise_after_restart(self, reader: TopicReader, rec: events_pb2.GradedInteraction,
                             *graders: GraderProcess) -> None:
        """Feedback for an interaction graded before the crash: revision 2, proof that its state (revision
        1, content digest) came back from the changelog."""
        iid = rec.interaction.interaction_id
        p = signed_producer(self.bootstrap, "inference")
        p.produce(self.topics.feedback, iid, feedback(iid, kind="thumbs", value=1.0))
        p.flush()
        recs = records_until(reader, lambda rs: len(by_interaction(rs, iid)) >= 2, *graders,
                             what="revision 2 after the restart", parse=graded)
        assert [r.revision for r in by_interaction(recs, iid)] == [1, 2]


def log_lines(path: Path, marker: str) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if marker in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line[line.index("{"):]))
    return out


@pytest.fixture
def run(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Run]:
    r = Run(kafka_bootstrap, tmp_path)
    try:
        yield r
    finally:
        delete_namespace(kafka_bootstrap, r.topics.prefix)


def test_kill9_mid_stream_loses_and_duplicates_nothing(run: Run) -> None:
    reader = TopicReader(run.bootstrap, run.topics.graded)
    g = run.grader(batch_max="100")
    killed = threading.Event()
    producer = threading.Thread(target=run.produce, kwargs={"n_rules": 3000, "n_support": 600, "pace_s": 0.2,
                                                            "hold": (1500, killed)})
    try:
        # let the worker join its group and recover (empty) tables
        reader.wait_for(lambda rs: False, 8)
        producer.start()
        records_until(reader, lambda rs: len(rs) >= 500, g, what="500 records graded before the kill")
        g.kill9()
        emitted_before = len(reader.records)
        assert producer.is_alive(), "the stream ended before the kill"
        killed.set()                     # the rest of the stream flows after the kill
        g = run.grader()
        producer.join(120)
        recs = run.check_exactly_once(reader, g)
        assert len(recs) == len(run.expected) == 3600 and emitted_before >= 500
        run.revise_after_restart(reader, recs[0], g)
    finally:
        killed.set()
        producer.join(120)
        g.stop()
        reader.close()


@pytest.mark.parametrize(("point", "outcome"), [
    # The first worker commits every 0.02 s, so it has usually committed offsets when it crashes: then the
    # restarted faust consumer used to leave some join records unread for good (108-115 of 600 interactions
    # never graded, in 1 of 2 runs). The stall watchdog (stall.py, 3 s here) re-reads such partitions from
    # their committed offset; the commit no longer skips an unacknowledged record (stream/patches.py, C5).
    # Since both: 12 of 12 runs of this case passed.
    ("after_state", "re_emitted"),
    ("after_emit", "already_emitted")])
def test_abrupt_exit_at_an_in_doubt_point_recovers_exactly_once(run: Run, point: str, outcome: str) -> None:
    """The emission marker is settled by looking in the graded topic (stream/recovery.py)."""
    run.produce(n_rules=600, n_support=0)
    reader = TopicReader(run.bootstrap, run.topics.graded)
    fast_commits = {"commit_interval_s": "0.02"} if point == "after_state" else {}
    g = run.grader(fault_injection=f"{point}:2", batch_max="50", **fast_commits)
    try:
        assert exit_code(g, reader=reader, what=f"the injected exit at {point}") == 137, g.log_tail()
        g = run.grader(stall_after_s="3")
        recs = run.check_exactly_once(reader, g)
        logs = log_lines(g.log_path, "settled in-doubt")
        assert logs, f"no recovery of in-doubt emissions logged:\n{g.log_tail()}"
        in_doubt, already = logs[0]["in_doubt"], logs[0]["already_emitted"]
        assert in_doubt > 0
        if outcome == "already_emitted":
            assert already == in_doubt  # every in-doubt record was found in the graded topic
        else:
            assert already == 0  # none had been sent: all re-emitted
        run.revise_after_restart(reader, recs[0], g)
    finally:
        g.stop()
        reader.close()


def test_a_batch_that_fails_is_retried_not_dropped(run: Run) -> None:
    """An exception in a batch must not reach faust's agent supervisor, which restarts the agent without
    the batch in hand: its records were lost (an intermittent loss of 35 of 600 records seen under load, most likely a Kafka
    call timing out under load). Here the batch fails after its state write, emissions in doubt: the
    same worker settles them and retries, and every record is graded exactly once."""
    run.produce(n_rules=600, n_support=0)
    reader = TopicReader(run.bootstrap, run.topics.graded)
    g = run.grader(fault_injection="fail_after_state:2", batch_max="50")
    try:
        run.check_exactly_once(reader, g)
        assert g.alive() and log_lines(g.log_path, "batch failed; retrying it"), g.log_tail()
        [settled] = log_lines(g.log_path, "settled in-doubt")
        assert settled["in_doubt"] > 0 and settled["already_emitted"] == 0
    finally:
        g.stop()
        reader.close()


TWO_WORKERS = {"batch_max": "100", "commit_interval_s": "0.05", "stall_after_s": "3"}  # commits that meet the rebalance


def test_two_workers_share_the_work_and_one_is_killed(run: Run) -> None:
    """Two workers split the partitions (a join item whose partition the other worker owns travels
    through the join topic); one is killed -9 mid-stream, so the survivor goes through a rebalance while
    it is busy grading and committing (a commit meeting it crashed faust's worker: stream/patches.py, C6);
    it takes the dead one's partitions over, with their state as committed (what the dead one left in
    doubt is settled), and every record is graded exactly once."""
    reader = TopicReader(run.bootstrap, run.topics.graded)
    a, b = run.grader(**TWO_WORKERS), run.grader(**TWO_WORKERS)
    killed = threading.Event()
    producer = threading.Thread(target=run.produce, kwargs={"n_rules": 2000, "n_support": 400, "pace_s": 0.2,
                                                            "hold": (1000, killed)})
    try:
        reader.wait_for(lambda rs: False, 8)  # both join and recover their tables
        producer.start()
        records_until(reader, lambda rs: len(rs) >= 600, a, b, what="600 records graded before the kill")
        assert producer.is_alive(), "the stream ended before the kill"
        a.kill9()
        killed.set()                     # the rest of the stream flows after the kill
        producer.join(120)
        recs = run.check_exactly_once(reader, b)
        assert len(recs) == 2400
        run.revise_after_restart(reader, recs[0], b)
    finally:
        killed.set()
        producer.join(120)
        a.stop()
        b.stop()
        reader.close()


def test_windows_still_expire_after_a_restart_without_new_records(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A window that was open at shutdown must close although no new record ever reaches its partition."""
    run = Run(kafka_bootstrap, tmp_path, CONFIG.replace("feedback_window_s: 600", "feedback_window_s: 8"))
    reader = TopicReader(run.bootstrap, run.topics.graded)
    g = run.grader()
    try:
        waiting = interaction(session_id="s-wait")
        marker = interaction(task="rules", text="1", session_id="s-marker")
        p = signed_producer(run.bootstrap, "inference")
        for it in (waiting, marker):
            p.produce(run.topics.interactions, it.session_id, it)
        p.flush()
        records_until(reader, lambda rs: any(r.interaction.interaction_id == marker.interaction_id for r in rs), g,
                      what="the marker graded", parse=graded)
        g.stop()  # graceful: offsets committed, nothing left to replay
        g = run.grader()
        recs = records_until(reader, lambda rs: any(r.interaction.interaction_id == waiting.interaction_id
                                                    for r in rs), g, what="the open window closed", parse=graded)
        [rec] = [r for r in recs if r.interaction.interaction_id == waiting.interaction_id]
        assert (rec.revision, rec.has_signal, rec.no_signal_reason) == (1, False, "window_expired")
    finally:
        g.stop()
        reader.close()
        delete_namespace(kafka_bootstrap, run.topics.prefix)
