"""Versioned bases: provenance, statuses, counters, operator actions, idempotence, durability order."""

from __future__ import annotations

import pytest

from services.extractor.curation import Curator
from services.extractor.knowledge import (
    Candidate,
    Extracted,
    KnowledgeStore,
    parse_knowledge_version,
    training_view,
)
from services.extractor.trajectories import SessionBuffer, Source, Trajectory
from shared.proto.apprentice.v1 import events_pb2
from shared.rpc.grpc_util import InvalidRequest, NotFound
from tests.unit.extractor.factories import graded

S = events_pb2.ItemStatus


class Topic:
    """Where snapshots go in these unit tests: a list, optionally failing like an unreachable broker."""

    def __init__(self) -> None:
        self.records: list[events_pb2.KnowledgeSnapshot] = []
        self.fail = False

    def __call__(self, snap: events_pb2.KnowledgeSnapshot) -> None:
        if self.fail:
            raise RuntimeError("broker unreachable")
        out = events_pb2.KnowledgeSnapshot()
        out.CopyFrom(snap)
        self.records.append(out)


def store(topic: Topic, *, approval: bool = False, max_tokens: int = 1000) -> KnowledgeStore:
    return KnowledgeStore(Curator(), topic, requires_approval=lambda tenant: approval, max_tokens=max_tokens)


def traj(*records: events_pb2.GradedInteraction) -> Trajectory:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    for r in records:
        buf.add(r)
    [(t, _)] = buf.ready()
    return t


AGENT = Source(key_id="agent-7", role="service", event_id="fb-1")


def test_versions_provenance_and_auto_approve() -> None:
    topic = Topic()
    st = store(topic)
    t1 = traj(graded(iid="i1", correction="24 months"))
    snap, verdicts = st.apply("acme/support", [Extracted(t1, [Candidate("Quote the warranty as 24 months.", "llm:m@v1", ["i1"],
                                                                        AGENT)], "m", "v1")])
    assert snap is not None and snap.version == 1 and [v.outcome for v in verdicts] == ["added"]
    [it] = snap.items
    assert it.status == S.ITEM_STATUS_APPROVED and list(it.source_interaction_ids) == ["i1"]
    assert [(p.action, p.principal.role, p.principal.key_id, p.tenant, list(p.interaction_ids)) for p in it.provenance] \
        == [("created", "service", "agent-7", "acme", ["i1"]), ("auto_approved", "service", "agent-7", "acme", [])]
    assert it.provenance[0].at == it.created_at and not it.screen_flags
    assert it.created_by == "llm:m@v1" and it.token_count > 0 and snap.extractor_policy_version == "v1"
    assert [(p.interaction_id, p.revision) for p in snap.processed] == [("i1", 1)]
    assert snap.envelope.tenant == "acme" and snap.key == "acme/support" and snap.domain == "support"
    # a paraphrase from another interaction merges provenance instead of adding an item
    t2 = traj(graded(iid="i2", session="s2"))
    snap2, v2 = st.apply("acme/support", [Extracted(t2, [Candidate("quote the warranty as 24 months!", "llm:m@v1", ["i2"])])])
    assert snap2 is not None and snap2.version == 2 and v2[0].outcome == "merged" and len(snap2.items) == 1
    assert list(snap2.items[0].source_interaction_ids) == ["i1", "i2"]
    assert [(p.action, p.principal.role, list(p.interaction_ids)) for p in snap2.items[0].provenance][-1] == \
        ("merged", "", ["i2"])                                  # that source recorded no caller
    assert [s.version for s in topic.records] == [1, 2]


def test_require_approval_keeps_new_items_out_of_the_training_view() -> None:
    st = store(Topic(), approval=True)
    snap, _ = st.apply("acme/support", [Extracted(traj(graded()), [Candidate("Quote the warranty as 24 months.", "x", ["i1"])])])
    assert snap is not None and snap.require_approval and snap.items[0].status == S.ITEM_STATUS_PROPOSED
    assert len(training_view(snap).items) == 0
    approved = st.act("acme/support", snap.items[0].item_id, "approve", "olga")
    assert approved.version == 2 and approved.items[0].edited_by == "olga"
    assert len(training_view(approved).items) == 1
    assert st.act("acme/support", snap.items[0].item_id, "approve").version == 2     # no-op, no new version


def test_actions_reject_pin_edit_and_errors() -> None:
    st = store(Topic())
    cands = [Candidate("Quote the warranty as 24 months.", "x", ["i1"]), Candidate("Returns need form R-12 always.", "x", ["i1"])]
    snap, _ = st.apply("acme/support", [Extracted(traj(graded()), cands)])
    assert snap is not None
    a, b = (it.item_id for it in snap.items)
    s2 = st.act("acme/support", a, "reject", "olga")
    s3 = st.act("acme/support", b, "pin", "olga")
    assert [it.status for it in s3.items] == [S.ITEM_STATUS_REJECTED, S.ITEM_STATUS_PINNED]
    assert [it.item_id for it in training_view(s3).items] == [b]
    s4 = st.act("acme/support", b, "edit", "olga", "Returns need form R-12 within 30 days.")
    assert s4.items[1].text.endswith("30 days.") and s4.items[1].item_id == b and s4.version == s2.version + 2
    with pytest.raises(InvalidRequest, match="personal data"):
        st.act("acme/support", b, "edit", "olga", "Returns go to returns@acme.example always.")
    with pytest.raises(InvalidRequest, match="duplicates"):
        st.act("acme/support", b, "edit", "olga", "Quote the warranty as 24 months!")
    with pytest.raises(NotFound):
        st.act("acme/support", "nope", "approve")
    with pytest.raises(NotFound):
        st.act("other/x", a, "approve")
    with pytest.raises(InvalidRequest):
        st.act("acme/support", a, "explode")
    # the rejected rule is not proposed again
    again, verdicts = st.apply("acme/support", [Extracted(traj(graded(iid="i9", session="s9")),
                                                          [Candidate("quote the warranty as 24 months", "x", ["i9"])])])
    assert verdicts[0].outcome == "merged" and again is not None and again.items[0].status == S.ITEM_STATUS_REJECTED
    assert st.get("acme/support", 1).version == 1 and st.get("acme/support").version == again.version


def test_pii_and_names_from_the_trajectory_are_rejected() -> None:
    st = store(Topic())
    t = traj(graded(question="Hi, my name is Carla. How long is the warranty?"))
    snap, verdicts = st.apply("acme/support", [Extracted(t, [Candidate("Carla should get 24 months of warranty.", "x", ["i1"]),
                                                             Candidate("Email receipts to c@x.io after a refund.", "x", ["i1"])])])
    assert snap is None and [v.outcome for v in verdicts] == ["rejected", "rejected"]
    assert "name" in verdicts[0].reason and "email" in verdicts[1].reason


def test_redelivered_revisions_change_nothing_but_a_new_revision_is_applied() -> None:
    topic = Topic()
    st = store(topic)
    cand = [Candidate("Quote the warranty as 24 months.", "x", ["i1"])]
    st.apply("acme/support", [Extracted(traj(graded(revision=1)), cand)])
    assert not st.is_new("acme/support", "i1", 1) and st.is_new("acme/support", "i1", 2)
    snap, _ = st.apply("acme/support", [Extracted(traj(graded(revision=1)), [Candidate("A brand new rule for this.", "x", ["i1"])])])
    assert snap is None and len(topic.records) == 1
    snap, _ = st.apply("acme/support", [Extracted(traj(graded(revision=2, correction="24 months")),
                                                  [Candidate("A brand new rule for this.", "x", ["i1"])])])
    assert snap is not None and snap.version == 2


def test_helpful_harmful_counters_follow_the_knowledge_version_in_context() -> None:
    st = store(Topic())
    v1, _ = st.apply("acme/support", [Extracted(traj(graded()), [Candidate("Quote the warranty as 24 months.", "x", ["i1"],
                                                                           AGENT)])])
    assert v1 is not None and v1.items[0].status == S.ITEM_STATUS_APPROVED      # counted only while it may reach training
    wins = traj(graded(iid="w", session="a", success=True, reward=1.0, knowledge_version="acme/support@1"))
    loss = traj(graded(iid="l", session="b", success=False, reward=-1.0, knowledge_version="v1"))
    other = traj(graded(iid="o", session="c", success=True, reward=1.0, knowledge_version="beta/x@1"))
    snap, _ = st.apply("acme/support", [Extracted(wins, []), Extracted(loss, []), Extracted(other, [])])
    assert snap is not None and (snap.items[0].helpful, snap.items[0].harmful) == (1, 1)
    # an interaction that names the items in its context counts exactly those
    second, _ = st.apply("acme/support", [Extracted(traj(graded(iid="i2", session="s2")),
                                                    [Candidate("Quote the shipping as 3 days.", "x", ["i2"], AGENT)])])
    assert second is not None and len(second.items) == 2
    rule, ship = second.items[0].item_id, second.items[1].item_id
    named = traj(graded(iid="n", session="d", success=True, reward=1.0, knowledge_version="acme/support@2",
                        in_context=(("acme/support", ship), ("beta/x", rule))))
    snap, _ = st.apply("acme/support", [Extracted(named, [])])
    assert snap is not None
    assert [(i.helpful, i.harmful) for i in snap.items] == [(1, 1), (1, 0)]   # not the whole version
    assert parse_knowledge_version("acme/support:3", "acme/support") == 3
    assert parse_knowledge_version("", "acme/support") is None


def test_token_cap_evicts_oldest_but_not_pinned() -> None:
    st = store(Topic(), max_tokens=12)   # ~4 chars per token: each rule is 8-9 tokens, pinned ones do not count
    first, _ = st.apply("k/d", [Extracted(traj(graded(iid="a", session="a")), [Candidate("The very first rule about refunds.", "x", ["a"])])])
    assert first is not None
    st.act("k/d", first.items[0].item_id, "pin")
    st.apply("k/d", [Extracted(traj(graded(iid="b", session="b")), [Candidate("Second rule about shipping costs.", "x", ["b"])])])
    snap, _ = st.apply("k/d", [Extracted(traj(graded(iid="c", session="c")), [Candidate("Third rule about gift cards now.", "x", ["c"])])])
    assert snap is not None and [it.text for it in snap.items] == ["The very first rule about refunds.", "Third rule about gift cards now."]
    assert "evicted by the token cap" in snap.change


def test_failed_publication_leaves_the_state_unchanged_and_load_restores() -> None:
    topic = Topic()
    st = store(topic)
    st.apply("k/d", [Extracted(traj(graded()), [Candidate("A rule that is durable.", "x", ["i1"])])])
    topic.fail = True
    with pytest.raises(RuntimeError):
        st.apply("k/d", [Extracted(traj(graded(iid="i2", session="s2")), [Candidate("A rule that never lands.", "x", ["i2"])])])
    assert st.get("k/d").version == 1 and st.is_new("k/d", "i2", 1)
    restored = store(Topic())
    for rec in reversed(topic.records):          # any order: the highest version wins
        restored.load(rec)
    assert restored.get("k/d") == st.get("k/d") and not restored.is_new("k/d", "i1", 1)
