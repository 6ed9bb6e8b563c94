"""The LLM judge end to end: grader -> real Inference gRPC server (tiny random model) -> judge results.

The tiny random model writes gibberish, so the judge must come back as *no signal* (never a reward),
the rule component must still carry the reward, a group must be judged once as a group, and the
judge's own Generate calls must not be captured as interactions (no_capture).
"""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

import pytest

from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import (
    GraderProcess,
    by_interaction,
    delete_namespace,
    graded,
    grader_env,
    interaction,
)
from tests.helpers.kafka import TopicReader
from tests.helpers.ports import free_port
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
version: judge-1
tasks:
  - tenant: demo
    task: judged
    graders:
      - {name: judge, type: judge, rubric: "States the warranty period in months.", max_new_tokens: 12,
         group_wait_s: 3, weight: 1.0}
      - {name: has_number, type: regex, pattern: "[0-9]+", weight: 1.0}
"""


def test_judge_scores_groups_through_inference(kafka_bootstrap: str, tiny_model_name: str, tmp_path: Path) -> None:
    from tests.helpers.inference import start_inference

    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_bootstrap, topics)
    inference = start_inference(tmp_path / "inference", model=tiny_model_name, bootstrap=kafka_bootstrap,
                                topic_prefix=topics.prefix)
    cfg = tmp_path / "grader.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    grader = GraderProcess(grader_env(topics.prefix, kafka_bootstrap, cfg, tmp_path, metrics_port=str(port),
                                      inference_endpoint=f"127.0.0.1:{inference.port}"),
                           tmp_path / "grader.log").start()
    reader = TopicReader(kafka_bootstrap, topics.graded)
    try:
        group = [interaction(task="judged", text=t, group_id="g-1", group_size=2)
                 for t in ("24 months.", "Two years, I think.")]
        single = interaction(task="judged", text="It is 24 months.")
        p = signed_producer(kafka_bootstrap, "inference")
        for it in [*group, single]:
            p.produce(topics.interactions, it.session_id, it)
        p.flush()
        ids = {it.interaction_id for it in [*group, single]}
        recs = reader.wait_for(lambda rs: {r.interaction.interaction_id for r in rs} >= ids, 90, parse=graded)
        assert {r.interaction.interaction_id for r in recs} >= ids, grader.log_tail()
        for it in [*group, single]:
            [rec] = by_interaction(recs, it.interaction_id)
            judge = {c.name: c for c in rec.components}["judge"]
            rule = {c.name: c for c in rec.components}["has_number"]
            if judge.has_signal:  # a random model can, rarely, write something readable
                assert 0.0 <= judge.value <= 1.0 and "/10" in judge.detail
            else:
                assert judge.detail.startswith("judge output unreadable"), judge.detail
                assert rec.reward == rule.value  # the masked judge does not count
            assert rec.has_signal and rule.has_signal
        # Three interactions, two judge calls: the group of two was judged together.
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        calls = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("apprentice_grader_judge_calls_total{"))
        assert calls == 2.0, metrics
        # The judge's own Generate calls were not captured as interactions.
        captured = TopicReader(kafka_bootstrap, topics.interactions)
        captured.poll(3.0)
        assert len(captured.records) == 3
        captured.close()
    finally:
        reader.close()
        grader.stop()
        inference.stop(grace=0)
        delete_namespace(kafka_bootstrap, topics.prefix)


MAX_POLL_S = 6.0       # the broker's minimum session timeout, and so the least poll interval librdkafka takes
SLOW_S = 11.0          # every judge Generate waits this long: past the interval + 3 s (the check below) with
                       # 2 s to spare for it (at 9 s it had ~0 s, and one CI run missed it)


def _members(admin, group: str) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    desc = admin.describe_consumer_groups([group])[group].result(10)
    return desc.state.name, sorted(m.member_id for m in desc.members)


def test_a_judge_slower_than_the_poll_interval_costs_no_membership(kafka_bootstrap: str, tiny_model_name: str,
                                                                   tmp_path: Path) -> None:
    """The real Inference service, slowed by its fault injection past the grader consumer's
    max.poll.interval: the judge still scores the group, and the broker sees the same members of the
    grader's group before, during and after the slow call (no eviction, no rebalance)."""
    import time

    from confluent_kafka.admin import AdminClient

    from shared.kafka.security import librdkafka_config
    from tests.helpers.inference import start_inference

    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_bootstrap, topics)
    inference = start_inference(tmp_path / "inference", model=tiny_model_name, bootstrap=kafka_bootstrap,
                                topic_prefix=topics.prefix, fault_delay_s=SLOW_S)
    cfg = tmp_path / "grader.yaml"
    cfg.write_text(CONFIG)
    grader = GraderProcess(grader_env(topics.prefix, kafka_bootstrap, cfg, tmp_path,
                                      inference_endpoint=f"127.0.0.1:{inference.port}",
                                      max_poll_interval_s=str(MAX_POLL_S), session_timeout_s=str(MAX_POLL_S)),
                           tmp_path / "grader.log").start()
    reader = TopicReader(kafka_bootstrap, topics.graded)
    admin = AdminClient({**librdkafka_config(), "bootstrap.servers": kafka_bootstrap})
    groups = [topics.group_id("apprentice-grader")]
    try:
        # the grader is settled in its groups before the slow call starts
        def settled() -> dict[str, tuple[str, list[str]]] | None:
            b = {g: _members(admin, g) for g in groups}
            return b if all(state == "STABLE" and members for state, members in b.values()) else None

        before = wait_for(settled, what="the grader's groups stable", stall_s=120, every=0.5,
                          detail=grader.log_tail)

        single = interaction(task="judged", text="It is 24 months.")
        p = signed_producer(kafka_bootstrap, "inference")
        p.produce(topics.interactions, single.session_id, single)
        p.flush()
        sent = time.monotonic()
        seen_during_call = False
        recs: list[events_pb2.GradedInteraction] = []
        while time.monotonic() < sent + 120 and not recs:
            if time.monotonic() - sent > MAX_POLL_S + 3:      # the judge call is past the poll interval
                assert {g: _members(admin, g) for g in groups} == before, grader.log_tail()
                seen_during_call = True
            reader.poll(0.5)
            recs = by_interaction([graded(m.value()) for m in reader.records], single.interaction_id)
        assert recs, grader.log_tail()
        assert time.monotonic() - sent >= SLOW_S > MAX_POLL_S     # the judge really was slower than the interval
        assert seen_during_call
        judge = {c.name: c for c in recs[0].components}["judge"]
        # the judge answered (a random model's answer is unreadable or, rarely, a score): not given up on
        assert judge.detail.startswith("judge output unreadable") or "/10" in judge.detail, judge.detail
        assert {g: _members(admin, g) for g in groups} == before
        assert "max.poll" not in grader.log_tail().lower() and "maximum poll" not in grader.log_tail().lower()
    finally:
        reader.close()
        grader.stop()
        inference.stop(grace=0)
        delete_namespace(kafka_bootstrap, topics.prefix)
