"""Knowledge for the teacher: only APPROVED/PINNED items of this tenant; TF-IDF retrieval; prompt layout."""

from __future__ import annotations

import random

from services.trainer.knowledge import KNOWLEDGE_HEADER, KnowledgeBase, tfidf_rank, with_knowledge
from shared.proto.apprentice.v1 import events_pb2
from tests.unit.trainer.factories import snapshot

APPROVED, PINNED, PROPOSED, REJECTED = (events_pb2.ITEM_STATUS_APPROVED, events_pb2.ITEM_STATUS_PINNED,
                                        events_pb2.ITEM_STATUS_PROPOSED, events_pb2.ITEM_STATUS_REJECTED)

ITEMS = ["The warranty lasts 14 months from delivery.", "Returns need form R-22 signed by the buyer.",
         "Call extension 417 for billing questions.", "Shipping to islands takes 9 days."]


def test_tfidf_rank_finds_the_relevant_item() -> None:
    assert tfidf_rank("how many months is the warranty?", ITEMS)[0] == 0
    assert tfidf_rank("which form do I need for returns", ITEMS)[0] == 1
    assert tfidf_rank("billing phone extension", ITEMS)[0] == 2


def test_with_knowledge_adds_or_merges_system_message() -> None:
    user = [{"role": "user", "content": "hi"}]
    out = with_knowledge(user, ["a", "b"])
    assert out[0] == {"role": "system", "content": f"{KNOWLEDGE_HEADER}\n- a\n- b"} and out[1] == user[0]
    merged = with_knowledge([{"role": "system", "content": "Be brief."}, *user], ["a"])
    assert merged[0]["content"] == f"Be brief.\n\n{KNOWLEDGE_HEADER}\n- a" and len(merged) == 2
    assert with_knowledge(user, []) == user


def test_only_trainable_items_of_this_tenant() -> None:
    kb = KnowledgeBase("acme")
    assert kb.apply(snapshot("acme", "support", 1, [(ITEMS[0], APPROVED), (ITEMS[1], PROPOSED),
                                                      (ITEMS[2], PINNED), (ITEMS[3], REJECTED)]))
    assert not kb.apply(snapshot("globex", "support", 5, [("secret", APPROVED)]))
    assert kb.skipped_other_tenant == 1
    assert kb.context("anything", "support", random.Random(0), retrieval="all") == [ITEMS[0], ITEMS[2]]
    assert kb.context("x", "billing", random.Random(0)) == []          # no knowledge for that domain
    assert kb.versions() == {"acme/support": 1}


def test_old_versions_ignored_and_snapshots_sampled() -> None:
    kb = KnowledgeBase("acme", keep=2)
    kb.apply(snapshot("acme", "support", 2, [("v2 item", APPROVED)]))
    assert not kb.apply(snapshot("acme", "support", 1, [("v1 item", APPROVED)]))
    kb.apply(snapshot("acme", "support", 3, [("v3 item", APPROVED)]))
    seen = {kb.context("q", "support", random.Random(seed))[0] for seed in range(20)}
    assert seen == {"v2 item", "v3 item"}


def test_retrieval_keeps_the_most_similar_items_in_base_order() -> None:
    kb = KnowledgeBase("acme")
    kb.apply(snapshot("acme", "general", 1, [(t, APPROVED) for t in ITEMS]))
    got = kb.context("warranty months and billing extension", "", random.Random(0), retrieval="tfidf", n_items=2)
    assert got == [ITEMS[0], ITEMS[2]]
