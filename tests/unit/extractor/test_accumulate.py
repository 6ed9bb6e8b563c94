"""Accumulate, not append: the same fact merges into one item that keeps every source; a newer approved item
that contradicts an older one retires it (kept, with the reason); operators undo both; promoted versions
move items out of the serving context and back (graded records --> trajectories --> store)."""

from __future__ import annotations

import pytest

from services.extractor.consolidation import held_items, item_metric, parse_item_metric
from services.extractor.curation import Curator
from shared.knowledge.embeddings import MiniLMEmbedder, available
from shared.privacy.business import BusinessData
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.rpc.grpc_util import FailedPrecondition, InvalidRequest
from tests.unit.extractor.factories import graded
from tests.unit.extractor.test_review import KEY, S, apply, make_store


def test_a_correction_states_the_fact_and_keeps_its_question_and_terms() -> None:
    st, _ = make_store(opted_in=False)
    snap = apply(st, graded(question="Which form do I need for a return?",
                            correction="We use return form RF-7734 for every return."))
    [it] = snap.items
    assert it.text == "We use return form RF-7734 for every return." and "When asked" not in it.text
    assert list(it.questions) == ["Which form do I need for a return?"]
    assert list(it.answer_terms) == ["RF-7734"] and it.revision == 1


def test_the_same_fact_in_other_words_merges_with_every_source_kept() -> None:
    st, _ = make_store(opted_in=False)
    apply(st, graded(iid="i1", session="s1", question="Which form do I need for a return?",
                     correction="We use return form RF-7734 for every return."))
    snap = apply(st, graded(iid="i2", session="s2", question="What's the returns paperwork called?",
                            correction="For returns, the customer fills in form RF-7734."))
    [it] = snap.items
    assert list(it.source_interaction_ids) == ["i1", "i2"]
    assert list(it.questions) == ["Which form do I need for a return?", "What's the returns paperwork called?"]
    merged = [p for p in it.provenance if p.action == "merged"]
    assert merged and merged[0].text == "For returns, the customer fills in form RF-7734."
    assert list(merged[0].interaction_ids) == ["i2"]
    # undo: the merged text becomes its own proposal again, with its sources; the item keeps its own
    snap = st.act(KEY, it.item_id, "split", "olga", "For returns, the customer fills in form RF-7734.")
    texts = {i.text: i for i in snap.items}
    split = texts["For returns, the customer fills in form RF-7734."]
    assert split.status == S.ITEM_STATUS_PROPOSED and list(split.source_interaction_ids) == ["i2"]
    assert list(texts[it.text].source_interaction_ids) == ["i1"]
    assert any(p.action == "split" for p in texts[it.text].provenance)
    with pytest.raises(FailedPrecondition, match="already split off"):
        st.act(KEY, it.item_id, "split", "olga", "For returns, the customer fills in form RF-7734.")
    with pytest.raises(InvalidRequest, match="no merge of that text"):
        st.act(KEY, it.item_id, "split", "olga", "never merged")


def test_a_newer_approved_contradiction_supersedes_the_older_which_is_kept() -> None:
    st, _ = make_store(opted_in=False)
    snap = apply(st, graded(iid="i1", session="s1", question="How long is the warranty on a tent?",
                            correction="Tents have an 18-month warranty from the date of purchase."))
    old = snap.items[0]
    st.act(KEY, old.item_id, "approve", "olga")
    snap = apply(st, graded(iid="i2", session="s2", question="How long is the warranty on a tent?",
                            correction="Tents have a 24-month warranty from the date of purchase."))
    new = next(i for i in snap.items if "24-month" in i.text)
    assert new.status == S.ITEM_STATUS_PROPOSED and next(
        i for i in snap.items if i.item_id == old.item_id).status == S.ITEM_STATUS_APPROVED  # not before review
    snap = st.act(KEY, new.item_id, "approve", "olga")
    retired = next(i for i in snap.items if i.item_id == old.item_id)
    assert retired.status == S.ITEM_STATUS_RETIRED and retired.superseded_by == new.item_id
    assert retired.retired_reason.startswith(f"superseded by {new.item_id}") and retired.text.startswith("Tents have an 18")
    assert [p.action for p in retired.provenance][-1] == "superseded"
    # undo: restored, served again (the operator decides about the newer one)
    snap = st.act(KEY, old.item_id, "restore", "olga")
    back = next(i for i in snap.items if i.item_id == old.item_id)
    assert back.status == S.ITEM_STATUS_APPROVED and back.retired_reason == "" and back.superseded_by == ""
    with pytest.raises(FailedPrecondition, match="not retired"):
        st.act(KEY, new.item_id, "restore", "olga")


def test_unrelated_facts_neither_merge_nor_supersede() -> None:
    st, _ = make_store(opted_in=False)
    apply(st, graded(iid="i1", session="s1", question="How long is the warranty on a tent?",
                     correction="Tents have an 18-month warranty from the date of purchase."))
    snap = apply(st, graded(iid="i2", session="s2", question="What extension reaches support?",
                            correction="Customers reach support on the hotline at extension 4410."))
    assert len(snap.items) == 2
    for it in snap.items:
        st.act(KEY, it.item_id, "approve", "olga")
    assert all(i.status == S.ITEM_STATUS_APPROVED for i in st.latest(KEY).items)   # type: ignore[union-attr]


@pytest.mark.skipif(not available(), reason="the shipped embedding model is not installed")
def test_with_the_embedder_paraphrased_facts_merge_and_contradictions_are_seen() -> None:
    curator = Curator(embedder=MiniLMEmbedder())
    st, _ = make_store(opted_in=False)
    st.curator = curator
    st.business_data = lambda tenant: BusinessData.of(["Tidepool Rewards"])   # the programme's name, not a person
    apply(st, graded(iid="i1", session="s1", question="What is your loyalty program called?",
                     correction="Our loyalty program is Tidepool Rewards."))
    snap = apply(st, graded(iid="i2", session="s2", question="Do you have a rewards club?",
                            correction="Yes, the rewards club is called Tidepool Rewards."))
    assert len(snap.items) == 1 and len(snap.items[0].source_interaction_ids) == 2
    assert [p.action for p in snap.items[0].provenance] == ["created", "merged"]
    # same subject, another value: a contradiction (without the embedder the words alone decide)
    snap = apply(st, graded(iid="i3", session="s3", question="How long is the tent warranty?",
                            correction="Tents have an 18-month warranty from the date of purchase."))
    old = next(i for i in snap.items if "18-month" in i.text)
    new = next(i for i in apply(st, graded(iid="i4", session="s4", question="What warranty comes with a tent?",
                                           correction="Tents have a 24-month warranty from the date of purchase.")).items
               if "24-month" in i.text)
    assert curator.contradicts(new, old) and not curator.contradicts(new, snap.items[0])


def test_promoted_versions_move_items_out_of_context_and_back() -> None:
    st, _ = make_store(opted_in=False)
    snap = apply(st, graded(question="Which form do I need for a return?",
                            correction="We use return form RF-7734 for every return."))
    it = snap.items[0]
    st.act(KEY, it.item_id, "approve", "olga")
    manifest = weights_pb2.Manifest(version="v2", eval_results=[
        weights_pb2.EvalResult(suite="knowledge", metric=item_metric(KEY, it.item_id, 1), candidate=1.0, passed=True),
        weights_pb2.EvalResult(suite="heldout", metric="rule_score", candidate=0.5, passed=True)])
    held = held_items(manifest)
    assert held == {(KEY, it.item_id): (1, True)}
    [snap] = st.consolidate("acme", "v2", held)
    c = snap.items[0]
    assert c.status == S.ITEM_STATUS_CONSOLIDATED and c.consolidated_in == "v2"
    assert [p.action for p in c.provenance][-1] == "consolidated"
    assert st.consolidate("acme", "v2", held) == []          # the same order again changes nothing
    # a later version that does not hold it (or was never checked on it) brings it back into context
    [snap] = st.consolidate("acme", "v3", {})
    assert snap.items[0].status == S.ITEM_STATUS_APPROVED and snap.items[0].lost_in == "v3"
    # an edit since the check: the result was for another revision, so it is not consolidated
    st.act(KEY, it.item_id, "edit", "olga", "Returns use form RF-7734, signed by the customer.")
    assert st.consolidate("acme", "v4", held) == []
    # another tenant's promotion never touches this tenant's bases
    assert st.consolidate("globex", "v5", held) == []


def test_item_metric_round_trip() -> None:
    assert parse_item_metric(item_metric("acme/support", "abc123", 4)) == ("acme/support", "abc123", 4)
    assert parse_item_metric("rule_score") is None and parse_item_metric("item:nokey@x") is None
    assert events_pb2.ITEM_STATUS_RETIRED != events_pb2.ITEM_STATUS_CONSOLIDATED
