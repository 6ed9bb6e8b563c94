"""A knowledge base with an item in every state, made by the real store from graded corrections and operator
actions (no hand-built snapshots): the dashboard's and the CLI's tests read it, and act on it."""

from __future__ import annotations

from dataclasses import dataclass

from services.extractor.knowledge import KnowledgeStore
from shared.proto.apprentice.v1 import events_pb2
from tests.unit.extractor.factories import graded
from tests.unit.extractor.test_review import KEY, apply, make_store

RETURNS = "We use return form RF-7734 for every return."
RETURNS_MERGED = "For returns, the customer fills in form RF-7734."
TENT_18 = "Tents have an 18-month warranty from the date of purchase."
TENT_24 = "Tents have a 24-month warranty from the date of purchase."
HOTLINE = "Customers reach support on the hotline at extension 4410."
KAYAKS = "Rental kayaks must be returned before 6 pm."
SHIPPING = "Orders ship within two business days."
SATURDAY = "Stores open at 9 am on Saturdays."


@dataclass
class Lifecycle:
    store: KnowledgeStore
    ids: dict[str, str]          # text --> item id

    def snapshot(self) -> events_pb2.KnowledgeSnapshot:
        snap = self.store.latest(KEY)
        assert snap is not None
        return snap


def lifecycle() -> Lifecycle:
    """acme/support with: RETURNS pending with RETURNS_MERGED merged into it; TENT_24 approved (serving),
    having superseded TENT_18 (retired); HOTLINE consolidated in v7; KAYAKS pinned; SHIPPING retired by
    operator olga; SATURDAY rejected."""
    st, _ = make_store(opted_in=False)
    ids: dict[str, str] = {}
    corrections = [("i1", "Which form do I need for a return?", RETURNS),
                   ("i2", "What's the returns paperwork called?", RETURNS_MERGED),
                   ("i3", "How long is the warranty on a tent?", TENT_18),
                   ("i4", "How long is the warranty on a tent?", TENT_24),
                   ("i5", "What extension reaches support?", HOTLINE),
                   ("i6", "When do stores open on Saturday?", SATURDAY),
                   ("i7", "When are rental kayaks due back?", KAYAKS),
                   ("i8", "How fast do orders ship?", SHIPPING)]
    for iid, question, correction in corrections:
        snap = apply(st, graded(iid=iid, session=f"s-{iid}", question=question, correction=correction))
        ids.update({it.text: it.item_id for it in snap.items})
        if correction == TENT_18:
            st.act(KEY, ids[TENT_18], "approve", "olga")
    assert RETURNS_MERGED not in ids                       # merged into RETURNS
    for text, action in ((TENT_24, "approve"), (HOTLINE, "approve"), (SATURDAY, "reject"), (KAYAKS, "pin"),
                         (SHIPPING, "approve"), (SHIPPING, "retire")):
        st.act(KEY, ids[text], action, "olga")
    assert st.consolidate("acme", "v7", {(KEY, ids[HOTLINE]): (1, True)})
    return Lifecycle(st, ids)
