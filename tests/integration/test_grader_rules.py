"""Grading rules set at run time, against the real broker.

An interaction and its KPI for a tenant the grader's file does not configure wait out the wildcard
rule's window (600 s here), and the grader says so on /metrics (the waiting summary and the feedback
kind no rule reads). `apprentice grader rules set` then gives the tenant a rule: the waiting interaction
is graded within seconds, under a grader_config_version naming the rule; the rule never applies to
another tenant; a record that is not a valid rule goes to the dead-letter topic and changes nothing;
`rules delete` brings the file's rule back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from shared.contracts.grader_waiting import describe, from_metrics
from shared.contracts.topics import GRADER_RULES, Topics
from shared.contracts.validation import KafkaHeaders
from shared.kafka.admin import ensure_topics
from shared.kafka.security import librdkafka_config
from shared.kafka.signing import RecordSigner
from shared.metrics import scrape
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import (
    REPO,
    GraderProcess,
    by_interaction,
    delete_namespace,
    feedback,
    graded,
    grader_env,
    interaction,
)
from tests.helpers.kafka import TopicReader
from tests.helpers.ports import free_port
from tests.helpers.signing import signed_producer, signer
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
version: rules-it-1
tasks:
  - tenant: demo
    task: support
    feedback_window_s: 300
    graders:
      - {name: resolved, type: kpi, kpi: resolved, success: true}
  - tenant: "*"
    task: "*"
    feedback_window_s: 600
    emit_when: any_feedback
    graders:
      - {name: thumbs, type: feedback, kind: thumbs, weight: 1.0, success: true}
"""


class Stack:
    def __init__(self, bootstrap: str, topics: Topics, grader: GraderProcess, port: int, home: Path) -> None:
        self.bootstrap, self.topics, self.grader, self.port, self.home = bootstrap, topics, grader, port, home
        self.producer = signed_producer(bootstrap, "inference", client_id="grader-rules-test")
        self.graded = TopicReader(bootstrap, topics.graded)
        self.dead = TopicReader(bootstrap, topics.deadletter)

    def send(self, topic: str, key: str, msg: events_pb2.Interaction | events_pb2.FeedbackEvent) -> None:
        self.producer.produce(topic, key, msg)
        self.producer.flush()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "APPRENTICE_TOPIC_PREFIX": self.topics.prefix, "APPRENTICE_KAFKA_BOOTSTRAP": self.bootstrap,
               "APPRENTICE_HOME": str(self.home / "cli-home")}
        return subprocess.run([sys.executable, "-m", "tools.cli.main", "grader", "rules", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)

    def waiting(self) -> str:
        return "\n".join(describe(from_metrics(scrape(f"127.0.0.1:{self.port}"))))


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_bootstrap, topics)
    home = tmp_path_factory.mktemp("grader-rules")
    cfg = home / "grader.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    grader = GraderProcess(grader_env(topics.prefix, kafka_bootstrap, cfg, home, metrics_port=str(port)),
                           home / "grader.log").start()
    s = Stack(kafka_bootstrap, topics, grader, port, home)
    try:
        # the rules follower is live: rule records refused while it caught up are only logged, never
        # dead-lettered (rules_follower.py), so a test that writes one first must not race the start
        wait_for(lambda: "runtime grading rules read" in grader.log_tail(), what="the grader's rules follower live",
                 max_s=120, detail=grader.log_tail)
        yield s
    finally:
        grader.stop()
        s.graded.close()
        s.dead.close()
        delete_namespace(kafka_bootstrap, topics.prefix)


def test_a_rule_set_at_run_time_grades_the_waiting_interaction_within_seconds(stack: Stack) -> None:
    acme = interaction(tenant="acme", task="billing")
    other = interaction(tenant="other", task="billing")
    for it in (acme, other):
        stack.send(stack.topics.interactions, it.session_id, it)
        stack.send(stack.topics.feedback, it.interaction_id,
                   feedback(it.interaction_id, tenant=it.envelope.tenant, kind="kpi", kpi_name="resolved", value=1.0))

    # waiting, and the grader says so: two answers, the wildcard window, the KPI that no rule reads
    wait_for(lambda: "2 answers waiting for feedback" in stack.waiting() and "kpi resolved" in stack.waiting(),
             what="the grader's waiting summary", stall_s=60, every=0.5,
             detail=lambda: f"{stack.waiting()}\n{stack.grader.log_tail()}")
    text = stack.waiting()
    assert "tenant acme/task billing, window 600 s, first graded at" in text, text
    assert "feedback kinds no rule reads: kpi resolved" in text, text
    assert not by_interaction(stack.graded.wait_for(lambda rs: False, 1, parse=graded), acme.interaction_id)

    out = stack.cli("set", "--tenant", "acme", "--task", "billing", "--kpi", "resolved", "--window", "30s")
    assert out.returncode == 0, out.stderr
    start = time.monotonic()
    recs = stack.graded.wait_for(lambda rs: bool(by_interaction(rs, acme.interaction_id)), 20, parse=graded)
    [rec] = by_interaction(recs, acme.interaction_id)
    assert time.monotonic() - start < 20
    assert (rec.revision, rec.has_signal, rec.reward, rec.success) == (1, True, 1.0, True)
    assert [c.name for c in rec.components] == ["resolved"]
    assert rec.grader_config_version.startswith("rules-it-1+acme/billing@r"), rec.grader_config_version

    # tenant B is not graded by tenant A's rule
    assert not by_interaction(stack.graded.wait_for(lambda rs: False, 2, parse=graded), other.interaction_id)
    wait_for(lambda: "tenant other/task billing, window 600 s" in stack.waiting(), what="other still waiting",
             stall_s=20, every=0.5, detail=stack.waiting)

    listed = stack.cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["key"] == "acme/billing" and row["record"]["rules"]["feedback_window_s"] == 30

    # a new interaction of acme: graded as soon as its KPI arrives
    again = interaction(tenant="acme", task="billing")
    stack.send(stack.topics.interactions, again.session_id, again)
    stack.send(stack.topics.feedback, again.interaction_id,
               feedback(again.interaction_id, tenant="acme", kind="kpi", kpi_name="resolved", value=0.0))
    recs = stack.graded.wait_for(lambda rs: bool(by_interaction(rs, again.interaction_id)), 20, parse=graded)
    assert by_interaction(recs, again.interaction_id)[0].reward == 0.0


def test_invalid_rule_records_are_dead_lettered_and_change_nothing(stack: Stack) -> None:
    p = Producer({**librdkafka_config(), "bootstrap.servers": stack.bootstrap})
    bad = [  # a rule under another tenant's key, a wildcard without the flag, a verifier, not JSON
        (b"victim/billing", json.dumps({"tenant": "acme", "task": "billing", "revision": 1, "operator": "x",
                                         "rules": {"graders": [{"name": "k", "type": "kpi", "kpi": "k"}]}})),
        (b"*/*", json.dumps({"tenant": "*", "task": "*", "revision": 1, "operator": "x",
                             "rules": {"graders": [{"name": "k", "type": "kpi", "kpi": "k"}]}})),
        (b"acme/code", json.dumps({"tenant": "acme", "task": "code", "revision": 1, "operator": "x",
                                   "rules": {"graders": [{"name": "v", "type": "verifier", "function": "os:system"}]}})),
        (b"acme/junk", "not json"),
    ]
    operator = signer("operator")  # signed as the operator: refused for what they say, not who wrote them
    for key, value in bad:
        p.produce(stack.topics.grader_rules, value.encode(), key,
                  headers=_signed(operator, GRADER_RULES, key, value.encode()))
    p.flush(10)
    letters = stack.dead.wait_for(
        lambda rs: sum(events_pb2.DeadLetter.FromString(m.value()).stage == "grader.rules" for m in rs) >= 4, 30)
    reasons = [d.reason for d in (events_pb2.DeadLetter.FromString(m.value()) for m in letters)
               if d.stage == "grader.rules"]
    assert any("under key 'victim/billing'" in r for r in reasons), reasons
    assert any("wildcard" in r for r in reasons), reasons
    assert any("verifier" in r for r in reasons), reasons

    listed = stack.cli("list")
    assert "victim" not in listed.stdout.split("not a rule record")[0] or "victim/billing: not a rule" in listed.stdout


def test_cli_refuses_invalid_rules_before_writing(stack: Stack, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("feedback_window_s: -5\ngraders:\n  - {name: r, type: kpi, kpi: resolved, weigth: 1}\n")
    out = stack.cli("set", "--tenant", "acme", "--task", "x", "--file", str(rules))
    assert out.returncode == 1
    assert "invalid rules for acme/x" in out.stderr and "feedback_window_s" in out.stderr and "weigth" in out.stderr
    out = stack.cli("set", "--tenant", "*", "--kpi", "resolved")
    assert out.returncode == 1 and "--all-tenants" in out.stderr
    assert "Traceback" not in out.stderr


def _signed(by: RecordSigner, *args: Any) -> KafkaHeaders:
    """`by`'s signing headers (shared/kafka/signing.py `RecordSigner.headers`), typed as producers take them."""
    return [*by.headers(*args)]
