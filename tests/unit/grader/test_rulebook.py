"""Grading rules set at run time (services/grader/core/rulebook.py): validation of rule records, how they merge
with the config file, what they stamp on graded records, and how a waiting interaction picks them up
(join.py): a new window moves its deadline, feedback already there may complete it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from services.grader.core.detectors import DetectorStats
from services.grader.core.join import FEEDBACK, INTERACTION, TICK, Joiner
from services.grader.core.rulebook import (
    OPERATOR,
    RuleBook,
    RuleRefused,
    new_record,
    parse_record,
)
from services.grader.core.state import PendingState
from shared.grading import parse_grader_config
from tests.helpers.grader import feedback, interaction

FILE = parse_grader_config({"version": "file-1", "tasks": [
    {"tenant": "demo", "task": "support", "feedback_window_s": 300,
     "graders": [{"name": "resolved", "type": "kpi", "kpi": "resolved"}]},
    {"tenant": "*", "task": "*", "feedback_window_s": 600, "emit_when": "any_feedback",
     "graders": [{"name": "thumbs", "type": "feedback", "kind": "thumbs"}]},
]})
KPI = {"graders": [{"name": "resolved", "type": "kpi", "kpi": "resolved", "success": True}],
       "feedback_window_s": 30}
T0 = 1_900_000_000.0


def window(book: RuleBook, tenant: str, task: str) -> float:
    t = book.config.for_task(tenant, task)
    assert t is not None
    return t.feedback_window_s


def record(tenant: str = "acme", task: str = "billing", *, revision: int = 1, **kw: object) -> bytes:
    return json.dumps({"tenant": tenant, "task": task, "revision": revision, "operator": "op", "rules": KPI,
                       **kw}).encode()


def test_a_rule_overrides_the_file_for_its_tenant_and_task_only() -> None:
    book = RuleBook(FILE)
    assert window(book, "acme", "billing") == 600   # the wildcard
    assert book.apply(parse_record(b"acme/billing", record(), signer=OPERATOR))
    assert window(book, "acme", "billing") == 30
    assert window(book, "acme", "other") == 600    # another task
    assert window(book, "beta", "billing") == 600  # another tenant
    assert window(book, "demo", "support") == 300
    t = book.config.for_task("acme", "billing")
    assert book.version_of("acme", "billing", t) == "file-1+acme/billing@r1"
    assert book.version_of("demo", "support", book.config.for_task("demo", "support")) == "file-1"
    # the same (tenant, task) as a file entry: replaced; a tenant-wide rule: most specific still wins
    book.apply(parse_record(b"demo/support", record("demo", "support", revision=5), signer=OPERATOR))
    assert window(book, "demo", "support") == 30
    book.apply(parse_record(b"acme/*", record("acme", "*", revision=2, rules={**KPI, "feedback_window_s": 60}),
                            signer=OPERATOR))
    assert window(book, "acme", "x") == 60
    assert window(book, "acme", "billing") == 30


def test_revisions_order_changes_and_deletion_restores_the_file() -> None:
    book = RuleBook(FILE)
    book.apply(parse_record(b"acme/billing", record(revision=2), signer=OPERATOR))
    rev = book.revision
    assert not book.apply(parse_record(b"acme/billing", record(revision=1, rules={**KPI, "feedback_window_s": 9}),
                                       signer=OPERATOR))   # older: ignored
    assert book.revision == rev and window(book, "acme", "billing") == 30
    assert book.apply(parse_record(b"acme/billing", record(revision=3, deleted=True, rules=None),
                                   signer=OPERATOR))
    assert window(book, "acme", "billing") == 600 and not book.rules()


@pytest.mark.parametrize(("key", "value", "why"), [
    (b"victim/billing", record(), "under key 'victim/billing'"),
    (b"*/*", record("*", "*"), "wildcard: true"),
    (b"acme/billing", record(rules={"tenant": "victim", **KPI}), "the rules name tenant 'victim'"),
    (b"acme/billing", record(rules={"graders": [{"name": "v", "type": "verifier", "function": "os:system"}]}),
     "a `verifier` grader can only come from the grader's config file"),
    (b"acme/billing", record(rules={"graders": [{"name": "j", "type": "judge", "rubric": "x"}]}), "`judge`"),
    (b"acme/billing", record(rules={"feedback_window_s": -1, "graders": KPI["graders"]}), "feedback_window_s"),
    (b"acme/billing", record(extra=1), "not a rule record"),
    (b"acme/billing", b"{not json", "not a rule record"),
    (b"acme/billing", None, "tombstone"),
    (b"ac me/billing", record("ac me"), "not a rule record"),
    (b"acme/billing", b" " * (64 * 1024 + 1), "bytes"),
    (b"acme/billing", record(rules={"feedback_window_s": float("nan"), "graders": KPI["graders"]}),
     "feedback_window_s"),
])
def test_invalid_records_are_refused(key: bytes, value: bytes | None, why: str) -> None:
    with pytest.raises(RuleRefused, match=None) as e:
        parse_record(key, value, signer=OPERATOR)
    assert why in str(e.value)


def test_wildcard_rules_need_the_explicit_flag() -> None:
    rec = parse_record(b"*/*", record("*", "*", wildcard=True), signer=OPERATOR)
    assert rec.wildcard
    with pytest.raises(RuleRefused, match="--all-tenants"):
        new_record("*", "*", operator="op", rules=KPI)
    assert new_record("*", "*", operator="op", rules=KPI, wildcard=True).wildcard


def test_only_the_operators_record_signature_counts() -> None:
    """The signer is what the follower verified (shared/kafka/trust.py); the record's own `operator`
    claim proves nothing, so a record without a signature or signed by another principal is refused."""
    value = new_record("acme", "billing", operator="claimed", rules=KPI, now=T0).model_dump_json().encode()
    with pytest.raises(RuleRefused, match="no record signature"):
        parse_record(b"acme/billing", value, signer="")
    with pytest.raises(RuleRefused, match="signed by inference"):
        parse_record(b"acme/billing", value, signer="inference")
    assert parse_record(b"acme/billing", value, signer=OPERATOR).operator == "claimed"
    # the HMAC field of the former scheme is no longer part of a record
    with pytest.raises(RuleRefused, match="signature"):
        parse_record(b"acme/billing", json.dumps({**json.loads(value), "signature": "hmac-sha256:00"}).encode(),
                     signer=OPERATOR)


class Feed:
    def __init__(self) -> None:
        self.book = RuleBook(FILE)
        self.joiner = Joiner(self.book, DetectorStats(FILE.detectors), retention_s=3600, orphan_feedback_s=600)
        self.raw: dict[str, bytes] = {}

    def send(self, key: str, value: bytes, now: float):  # type: ignore[no-untyped-def]
        state = PendingState.decode(self.raw[key]) if key in self.raw else None
        step = self.joiner.apply(state, key, value, now, partition=0)
        if step.changed and step.state is not None:
            self.raw[key] = step.state.encode()
        return step


def test_a_waiting_interaction_picks_up_a_new_rule_at_its_next_tick() -> None:
    f = Feed()
    it = interaction(tenant="acme", task="billing", occurred_at=datetime.fromtimestamp(T0, UTC))
    iid = it.interaction_id
    assert f.send(iid, INTERACTION + it.SerializeToString(), T0).note == "waiting for feedback"
    fb = feedback(iid, tenant="acme", kind="kpi", kpi_name="resolved", value=1.0)
    fb.envelope.occurred_at.FromMicroseconds(int((T0 + 5) * 1e6))
    step = f.send(iid, FEEDBACK + fb.SerializeToString(), T0 + 5)
    assert step.emit is None and step.state is not None and step.state.deadline == T0 + 600
    assert f.joiner.unread == {("acme", "billing", "kpi:resolved"): 1}   # no rule reads it: counted
    f.book.apply(parse_record(b"acme/billing", record(revision=7), signer=OPERATOR))
    # the runtimes tick every open window after a change: the KPI already here completes it now
    step = f.send(iid, TICK, T0 + 10)
    assert step.emit is not None and step.emit.reward == 1.0 and step.state is not None
    assert step.state.deadline == T0 + 30 and step.state.window == 30
    assert step.emit.grader_config_version == "file-1+acme/billing@r7"


def test_a_shorter_window_closes_a_waiting_interaction_without_its_feedback() -> None:
    f = Feed()
    it = interaction(tenant="acme", task="billing", occurred_at=datetime.fromtimestamp(T0, UTC))
    f.send(it.interaction_id, INTERACTION + it.SerializeToString(), T0)
    assert f.send(it.interaction_id, TICK, T0 + 40).emit is None       # the file's 600 s
    f.book.apply(parse_record(b"acme/billing", record(), signer=OPERATOR))
    step = f.send(it.interaction_id, TICK, T0 + 41)
    assert step.emit is not None and not step.emit.has_signal and step.emit.no_signal_reason == "window_expired"


def test_feedback_a_rule_reads_is_not_counted_as_unread() -> None:
    f = Feed()
    it = interaction(tenant="demo", task="support", occurred_at=datetime.fromtimestamp(T0, UTC))
    f.send(it.interaction_id, INTERACTION + it.SerializeToString(), T0)
    for kind, name in (("kpi", "resolved"), ("correction", ""), ("kpi", "tool_timeout")):
        fb = feedback(it.interaction_id, tenant="demo", kind=kind, kpi_name=name, value=1.0 if kind == "kpi" else 0.0,
                      comment="fixed" if kind == "correction" else "")
        fb.envelope.occurred_at.FromMicroseconds(int((T0 + 1) * 1e6))
        f.send(it.interaction_id, FEEDBACK + fb.SerializeToString(), T0 + 1)
    assert f.joiner.unread == {("demo", "support", "correction"): 1}
