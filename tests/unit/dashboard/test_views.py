"""Manifests, pod status and knowledge snapshots --> the versions and knowledge pages' JSON (knowledge in every
state, made by the real store: pending, serving in context, consolidated, retired, rejected; merges,
supersession, and the actions offered per state)."""

from __future__ import annotations

import pytest

from services.dashboard.views import knowledge_view, versions_view
from shared.grpc_util import FailedPrecondition
from shared.proto.apprentice.v1 import common_pb2, events_pb2, weights_pb2
from tests.unit.dashboard.knowledge_states import (
    HOTLINE,
    KAYAKS,
    RETURNS,
    RETURNS_MERGED,
    SATURDAY,
    SHIPPING,
    TENT_18,
    TENT_24,
    lifecycle,
)
from tests.unit.extractor.test_review import KEY, make_store


def manifest(version: str, parent: str, created: int, status: weights_pb2.VersionStatus, heldout: float, ood: float,
             hacking: float) -> weights_pb2.Manifest:
    m = weights_pb2.Manifest(model="m", version=version, parent_version=parent, algorithm="oel", kind="full",
                             status=status, data_offsets=[common_pb2.TopicOffsets(
                                 topic="apprentice.graded.v1", partition=0, start_offset=3, end_offset=9)],
                             eval_results=[
                                 weights_pb2.EvalResult(suite="heldout", metric="rule_score", candidate=heldout,
                                                        baseline=0.1, passed=True),
                                 # another scale in the same suite: listed in the table, not drawn
                                 weights_pb2.EvalResult(suite="ood", metric="ref_loglik", candidate=-2.5,
                                                        baseline=-2.4, passed=True),
                                 weights_pb2.EvalResult(suite="ood", metric="rule_score", candidate=ood,
                                                        baseline=0.5, passed=True),
                                 weights_pb2.EvalResult(suite="training_data", metric="hacking_flag_fraction",
                                                        candidate=hacking, passed=hacking < 0.1)])
    m.created_at.FromSeconds(created)
    return m


def test_versions_lineage_curve_canary_and_pods() -> None:
    v2 = manifest("v2", "v1", 200, weights_pb2.VERSION_STATUS_CANARY, 0.4, 0.7, 0.0)
    v1 = manifest("v1", "", 100, weights_pb2.VERSION_STATUS_PROMOTED, 0.2, 0.6, 0.05)
    status = weights_pb2.StatusResponse(model="m", promoted_version="v1", canary_version="v2", canary_fraction=0.25,
                                        pods=[weights_pb2.PodStatus(pod_id="pod-0", serving_version="v1",
                                                                    canary_version="v2", canary_requests=7,
                                                                    converged=True)])
    view = versions_view([v2, v1], status)
    assert [r["version"] for r in view["versions"]] == ["v1", "v2"]         # oldest first
    r1, r2 = view["versions"]
    assert (r1["parent"], r1["status"], r1["canary"]) == ("base", "promoted", None)
    assert (r2["parent"], r2["status"], r2["canary"]) == ("v1", "canary", {"fraction": 0.25, "requests": 7})
    assert r1["data_offsets"] == [{"topic": "apprentice.graded.v1", "partition": 0, "start": 3, "end": 9}]
    curve = {c["label"]: [(p["version"], p["value"]) for p in c["points"]] for c in view["curve"]}
    # the base model's score (v1's baseline) opens the success lines; one metric per line
    assert curve == {"held-out": [("base", 0.1), ("v1", 0.2), ("v2", 0.4)],
                     "OOD": [("base", 0.5), ("v1", 0.6), ("v2", 0.7)],
                     "hacking fraction": [("v1", 0.05), ("v2", 0.0)]}
    assert [e["metric"] for e in r1["eval"]] == ["rule_score", "ref_loglik", "rule_score", "hacking_flag_fraction"]
    [pod] = view["pods"]
    assert (pod["pod"], pod["serving"], pod["canary"], pod["canary_requests"]) == ("pod-0", "v1", "v2", 7)
    assert versions_view([], None)["pods"] == []


def test_knowledge_pending_first_with_provenance() -> None:
    S = events_pb2
    snap = S.KnowledgeSnapshot(key="demo/support", domain="support", version=4, require_approval=True, items=[
        S.KnowledgeItem(item_id="b", text="approved rule", status=S.ITEM_STATUS_APPROVED),
        S.KnowledgeItem(item_id="a", text="a proposal", status=S.ITEM_STATUS_PROPOSED, screen_flags=["override"],
                        source_interaction_ids=["i1"], provenance=[S.Provenance(
                            action="created", source="correction",
                            principal=common_pb2.Principal(key_id="shop-web", role="backend"))])])
    [base] = knowledge_view([snap])
    assert (base["tenant"], base["pending"], base["require_approval"]) == ("demo", 1, True)
    first = base["items"][0]
    assert (first["id"], first["status"], first["screen_flags"], first["sources"]) == ("a", "proposed", ["override"], ["i1"])
    assert first["provenance"][0] | {"at": 0} == {"action": "created", "by": "shop-web", "role": "backend",
                                                 "source": "correction", "at": 0, "detail": ""}


def test_knowledge_states_counts_questions_and_terms() -> None:
    lc = lifecycle()
    [base] = knowledge_view([lc.snapshot()])
    assert base["counts"] == {"pending": 1, "serving in context": 2, "consolidated": 1, "retired": 2, "rejected": 1}
    assert base["pending"] == 1
    items = {i["text"]: i for i in base["items"]}
    states = {t: (i["status"], i["state"], i["state_detail"]) for t, i in items.items()}
    assert states == {
        RETURNS: ("proposed", "pending", ""),
        TENT_24: ("approved", "serving in context", ""),
        KAYAKS: ("pinned", "serving in context", "pinned"),
        HOTLINE: ("consolidated", "consolidated", "in v7"),
        TENT_18: ("retired", "retired", f"superseded by {lc.ids[TENT_24]}"),
        SHIPPING: ("retired", "retired", "retired by operator olga"),
        SATURDAY: ("rejected", "rejected", "")}
    # pending first, then serving (pinned before approved), consolidated, retired, rejected
    assert [i["state"] for i in base["items"]] == ["pending", "serving in context", "serving in context",
                                                   "consolidated", "retired", "retired", "rejected"]
    assert items[RETURNS]["questions"] == ["Which form do I need for a return?", "What's the returns paperwork called?"]
    assert items[RETURNS]["answer_terms"] == ["RF-7734"] and items[HOTLINE]["consolidated_in"] == "v7"
    assert items[SHIPPING]["retired_reason"] == "retired by operator olga" and items[SHIPPING]["superseded_by"] is None


def test_knowledge_consolidated_item_lost_by_a_later_version_serves_again() -> None:
    lc = lifecycle()
    lc.store.consolidate("acme", "v8", {})
    [base] = knowledge_view([lc.snapshot()])
    hotline = next(i for i in base["items"] if i["text"] == HOTLINE)
    assert (hotline["state"], hotline["lost_in"], hotline["actions"]) == ("serving in context", "v8", ["retire", "edit"])
    assert "v8 does not answer it" in hotline["state_detail"]
    assert base["counts"]["consolidated"] == 0 and base["counts"]["serving in context"] == 3


def test_knowledge_supersession_names_the_newer_item_with_its_text() -> None:
    lc = lifecycle()
    [base] = knowledge_view([lc.snapshot()])
    items = {i["text"]: i for i in base["items"]}
    old, new = items[TENT_18], items[TENT_24]
    assert old["superseded_by"] == {"id": lc.ids[TENT_24], "text": TENT_24, "status": "approved"}
    assert old["retired_reason"].startswith(f"superseded by {lc.ids[TENT_24]}")
    assert new["supersedes"] == [{"id": lc.ids[TENT_18], "text": TENT_18}] and new["superseded_by"] is None
    # the newer item gone from the base (evicted): its id stays, its text is unknown
    snap = lc.snapshot()
    keep = [it for it in snap.items if it.text != TENT_24]
    del snap.items[:]
    snap.items.extend(keep)
    [base] = knowledge_view([snap])
    old = next(i for i in base["items"] if i["text"] == TENT_18)
    assert old["superseded_by"] == {"id": lc.ids[TENT_24], "text": "", "status": ""} and old["actions"][0] == "restore"


def test_knowledge_merges_show_each_merged_text_with_its_sources_until_split_off() -> None:
    lc = lifecycle()
    [base] = knowledge_view([lc.snapshot()])
    returns = next(i for i in base["items"] if i["text"] == RETURNS)
    [merge] = returns["merges"]
    assert (merge["text"], merge["sources"], merge["source"], merge["split"], merge["can_split"]) == (
        RETURNS_MERGED, ["i2"], "correction", False, True)
    assert merge["at"] > 0 and returns["sources"] == ["i1", "i2"]
    assert all(i["merges"] == [] for i in base["items"] if i["text"] != RETURNS)
    # split off: the merge stays in the trail, no longer offered; the text is a pending item of its own
    lc.store.act(KEY, lc.ids[RETURNS], "split", "olga", RETURNS_MERGED)
    [base] = knowledge_view([lc.snapshot()])
    items = {i["text"]: i for i in base["items"]}
    [merge] = items[RETURNS]["merges"]
    assert (merge["split"], merge["can_split"]) == (True, False) and items[RETURNS]["sources"] == ["i1"]
    assert items[RETURNS_MERGED]["state"] == "pending" and items[RETURNS_MERGED]["sources"] == ["i2"]
    assert base["counts"]["pending"] == 2


def test_knowledge_exact_restatement_merge_cannot_be_split() -> None:
    item = events_pb2.KnowledgeItem(item_id="a", text="Tents have a 24-month warranty.", status=events_pb2.ITEM_STATUS_APPROVED,
                                    provenance=[events_pb2.Provenance(action="created", interaction_ids=["i1"]),
                                                events_pb2.Provenance(action="merged", interaction_ids=["i2"])])
    [base] = knowledge_view([events_pb2.KnowledgeSnapshot(key="acme/support", version=2, items=[item])])
    assert base["items"][0]["merges"] == [{"text": "", "sources": ["i2"], "at": 0.0, "by": "", "role": "",
                                           "source": "", "split": False, "can_split": False}]


def test_knowledge_actions_offered_only_where_they_can_succeed() -> None:
    lc = lifecycle()
    [base] = knowledge_view([lc.snapshot()])
    actions = {i["text"]: i["actions"] for i in base["items"]}
    assert actions == {RETURNS: ["approve", "reject", "edit"], TENT_24: ["retire", "edit"], KAYAKS: ["retire", "edit"],
                       HOTLINE: ["retire", "edit"], TENT_18: ["restore", "edit"], SHIPPING: ["restore", "edit"],
                       SATURDAY: ["edit"]}
    assert all("restore" not in a for t, a in actions.items() if t not in (TENT_18, SHIPPING))
    # each offered action succeeds on the real store in that state (and restore on any other is refused)
    for text, offered in actions.items():
        for action in offered:
            if action != "edit":
                fresh, _ = make_store()
                fresh.load(lc.snapshot())
                fresh.act(KEY, lc.ids[text], action, "olga")
    with pytest.raises(FailedPrecondition):
        lc.store.act(KEY, lc.ids[TENT_24], "restore", "olga")
    # the dashboard never sends the screen override: a flagged item offers only what takes it out of service
    flagged = {status: events_pb2.KnowledgeItem(item_id=f"f{status}", text="x", status=status, screen_flags=["role_play"])
               for status in (events_pb2.ITEM_STATUS_PROPOSED, events_pb2.ITEM_STATUS_APPROVED,
                              events_pb2.ITEM_STATUS_RETIRED)}
    [base] = knowledge_view([events_pb2.KnowledgeSnapshot(key="acme/support", items=list(flagged.values()))])
    assert {i["status"]: i["actions"] for i in base["items"]} == {
        "proposed": ["reject", "edit"], "approved": ["retire", "edit"], "retired": ["edit"]}
    st, _ = make_store()
    st.load(events_pb2.KnowledgeSnapshot(key=KEY, version=1, items=list(flagged.values())))
    for status, action in ((events_pb2.ITEM_STATUS_PROPOSED, "approve"), (events_pb2.ITEM_STATUS_RETIRED, "restore")):
        with pytest.raises(FailedPrecondition, match="flagged"):
            st.act(KEY, flagged[status].item_id, action, "olga")
    st.act(KEY, flagged[events_pb2.ITEM_STATUS_APPROVED].item_id, "retire", "olga")   # taking it out needs no override
