"""Retrieval of the items relevant to a request (shared/knowledge/retrieval.py): the threshold, the margin
below the best item, the budgets, and the embedding/TF-IDF combination, on hand-made vectors."""

from __future__ import annotations

from collections.abc import Sequence

from shared.knowledge.retrieval import Entry, Retriever, tfidf_rank


class TableEmbedder:
    """Unit vectors from a lookup table (a text not in it gets the zero vector: similar to nothing)."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return [self.table.get(t, [0.0, 0.0, 0.0, 0.0]) for t in texts]


A = Entry("t/d", "a", 1, 1, "Tents have an 18-month warranty.", ("How long is the tent warranty?",), tokens=8)
B = Entry("t/d", "b", 1, 1, "Returns use form RF-7734.", ("Which return form?",), tokens=6)
C = Entry("t/d", "c", 1, 1, "Support is on extension 4410.", (), tokens=7)
Q = "What warranty do tents get?"
TABLE = {Q: [1.0, 0.0, 0.0, 0.0], A.text: [0.9, 0.436, 0.0, 0.0], A.questions[0]: [0.95, 0.312, 0.0, 0.0],
         B.text: [0.6, 0.8, 0.0, 0.0], B.questions[0]: [0.5, 0.866, 0.0, 0.0], C.text: [0.3, 0.954, 0.0, 0.0]}


def test_best_match_of_text_or_question_and_cached_vectors() -> None:
    emb = TableEmbedder(TABLE)
    r = Retriever(emb, min_score=0.4, margin=1.0)
    r.warm([A, B, C])
    scored = r.score(Q, [A, B, C])
    assert [e.item_id for e, _ in scored] == ["a", "b", "c"] and abs(scored[0][1] - 0.95) < 1e-6
    r.score(Q, [A, B, C])
    assert emb.calls[1:] == [[Q], [Q]], "item vectors come from the cache; only the query is embedded"


def test_threshold_margin_and_budgets() -> None:
    r = Retriever(TableEmbedder(TABLE), min_score=0.4, margin=0.2)
    assert [e.item_id for e, _ in r.select(Q, [A, B, C], max_items=3, max_tokens=100)] == ["a"]   # b is 0.35 below
    wide = Retriever(TableEmbedder(TABLE), min_score=0.4, margin=1.0)
    assert [e.item_id for e, _ in wide.select(Q, [A, B, C], max_items=3, max_tokens=100)] == ["a", "b"]  # c < 0.4
    assert [e.item_id for e, _ in wide.select(Q, [A, B, C], max_items=1, max_tokens=100)] == ["a"]
    assert [e.item_id for e, _ in wide.select(Q, [A, B, C], max_items=3, max_tokens=7)] == ["b"]   # a is 8 tokens
    assert wide.select("", [A, B], max_items=3, max_tokens=100) == []


def test_words_shared_with_the_item_count_where_the_embedder_misses() -> None:
    r = Retriever(TableEmbedder({}), min_score=0.4, margin=0.2)   # the embedder sees nothing in common
    chosen = r.select("Welches Formular RF-7734 brauche ich?", [A, B, C], max_items=3, max_tokens=100)
    assert [e.item_id for e, _ in chosen] == ["b"]


def test_tfidf_rank_orders_by_overlap() -> None:
    assert tfidf_rank("return form", [A.text, B.text, C.text])[0] == 1
