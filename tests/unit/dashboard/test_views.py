"""Manifests, pod status and knowledge snapshots --> the versions and knowledge pages' JSON."""

from __future__ import annotations

from services.dashboard.views import knowledge_view, versions_view
from shared.proto.apprentice.v1 import common_pb2, events_pb2, weights_pb2


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
