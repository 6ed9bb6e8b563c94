"""Manifests, pod status and knowledge snapshots --> the versions and knowledge pages' JSON (knowledge in every
state, made by the real store: pending, serving in context, consolidated, retired, rejected; merges,
supersession, and the actions offered per state)."""

from __future__ import annotations

from typing import Any

import pytest

from services.dashboard.views import knowledge_view, versions_view
from shared.proto.apprentice.v1 import common_pb2, events_pb2, weights_pb2
from shared.rpc.grpc_util import FailedPrecondition
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


def _row(view: dict[str, Any], version: str) -> dict[str, Any]:
    return next(r for r in view["versions"] if r["version"] == version)


def test_versions_offer_only_the_orders_the_weights_service_accepts() -> None:
    s = weights_pb2
    v1 = manifest("v1", "", 100, s.VERSION_STATUS_RETIRED, 0.2, 0.6, 0.0)
    v2 = manifest("v2", "v1", 200, s.VERSION_STATUS_PROMOTED, 0.3, 0.6, 0.0)
    v3 = manifest("v3", "v2", 300, s.VERSION_STATUS_CANARY, 0.4, 0.6, 0.0)
    v4 = manifest("v4", "v3", 400, s.VERSION_STATUS_REJECTED, 0.1, 0.6, 0.5)
    v5 = manifest("v5", "v2", 500, s.VERSION_STATUS_ROLLED_BACK, 0.3, 0.6, 0.0)
    v6 = manifest("v6", "v2", 600, s.VERSION_STATUS_APPROVED, 0.3, 0.6, 0.0)
    v7 = manifest("v7", "v2", 700, s.VERSION_STATUS_CANDIDATE, 0.3, 0.6, 0.0)
    v8 = manifest("v8", "v2", 800, s.VERSION_STATUS_APPROVED, 0.3, 0.6, 0.0)
    v8.kind, v8.base_version = "lora", "v0"                                  # its base version is gone
    status = s.StatusResponse(model="m", promoted_version="v2", canary_version="v3", canary_fraction=0.1,
                              tenant_versions={"": "v2"}, tenant_canaries={"": "v3"})
    view = versions_view([v1, v2, v3, v4, v5, v6, v7, v8], status)
    offered = {r["version"]: r["actions"] for r in view["versions"]}
    assert offered == {
        "v1": ["promote", "canary", "rollback"],     # retired: promoted again, or rolled back to
        "v2": ["rollback"],                          # served: only ending the canary of its slot
        "v3": ["promote", "canary", "rollback"],     # the canary: graduate it, change its share, roll back to it
        "v4": [],                                    # rejected by the gate
        "v5": ["rollback"],                          # rolled back: promote / canary need the CLI's force
        "v6": ["promote", "canary", "rollback"],
        "v7": ["promote", "canary", "rollback"],     # a candidate: promote / canary run the eval gate first
        "v8": ["rollback"]}
    served = _row(view, "v2")
    assert served["serving"] and served["slot_canary"] == "v3"
    assert served["not_offered"] == {"promote": "served now (every tenant)", "canary": "served now (every tenant)"}
    assert _row(view, "v4")["not_offered"] == dict.fromkeys(("promote", "canary", "rollback"),
                                                            "rejected by the eval gate")
    assert "--force" in _row(view, "v5")["not_offered"]["promote"]
    assert _row(view, "v8")["not_offered"]["canary"] == "its base version v0 is not stored"
    assert not _row(view, "v1")["serving"] and _row(view, "v1")["not_offered"] == {}

    # no canary: the served version offers nothing (the weights service: "nothing to roll back")
    quiet = versions_view([v1, v2], s.StatusResponse(model="m", promoted_version="v2", tenant_versions={"": "v2"}))
    assert _row(quiet, "v2")["actions"] == []
    assert set(_row(quiet, "v2")["not_offered"].values()) == {"served now (every tenant)"}
    # nothing promoted yet: the base serves, every approved version can go
    fresh = versions_view([v6], s.StatusResponse(model="m", promoted_version="base", tenant_versions={"": "base"}))
    assert _row(fresh, "v6")["actions"] == ["promote", "canary", "rollback"]


def test_versions_actions_follow_the_version_tenant_slot() -> None:
    s = weights_pb2
    shop3 = manifest("v3", "", 300, s.VERSION_STATUS_PROMOTED, 0.4, 0.6, 0.0)
    shop3.tenant = "shop"
    op2 = manifest("v2", "", 200, s.VERSION_STATUS_PROMOTED, 0.3, 0.6, 0.0)
    shop4 = manifest("v4", "v3", 400, s.VERSION_STATUS_CANARY, 0.4, 0.6, 0.0)
    shop4.tenant = "shop"
    status = s.StatusResponse(model="m", promoted_version="v2", tenant_versions={"": "v2", "shop": "v3"},
                              tenant_canaries={"shop": "v4"})
    view = versions_view([op2, shop3, shop4], status)
    assert _row(view, "v2")["actions"] == [] and _row(view, "v2")["not_offered"]["canary"] == "served now (every tenant)"
    shop = _row(view, "v3")
    assert shop["actions"] == ["rollback"] and shop["slot_canary"] == "v4"     # ends shop's canary
    assert shop["not_offered"]["promote"] == "served now (tenant shop)"
    assert _row(view, "v4")["actions"] == ["promote", "canary", "rollback"]
    assert view["tenant_canaries"] == {"shop": "v4"}


def test_versions_integrity_failure_is_never_served() -> None:
    m = manifest("v9", "", 900, weights_pb2.VERSION_STATUS_APPROVED, 0.3, 0.6, 0.0)
    m.eval_results.append(weights_pb2.EvalResult(suite="integrity", metric="nonfinite_tensors", candidate=3,
                                                 passed=False))
    [row] = versions_view([m], None)["versions"]
    assert row["actions"] == [] and set(row["not_offered"].values()) == {"non-finite weights: never served"}


@pytest.mark.parametrize(("tenant_versions", "text"), [
    ({}, "base"),                                                        # nothing promoted: the base
    ({"": "base"}, "base"),
    ({"": "v2"}, "v2"),
    ({"": "base", "default": "v3"}, "v3 for tenant default · base for every other tenant"),
    ({"": "v2", "shop": "v4", "default": "v3"}, "v3 for tenant default · v4 for tenant shop · v2 for every other tenant"),
])
def test_promoted_card_reads_as_a_sentence(tenant_versions: dict[str, str], text: str) -> None:
    status = weights_pb2.StatusResponse(model="m", promoted_version=tenant_versions.get("", ""),
                                        tenant_versions=tenant_versions)
    assert versions_view([], status)["promoted_text"] == text
    assert versions_view([], None)["promoted_text"] == "base"
