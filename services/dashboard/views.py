"""Weights manifests, pod status and knowledge snapshots (protos from the services' gRPC APIs) --> the
JSON the pages draw. Pure conversions, no network: the gRPC calls are in `backends.py`."""

from __future__ import annotations

from typing import Any

from shared.proto.apprentice.v1 import events_pb2, weights_pb2

ITEM_STATUS = {events_pb2.ITEM_STATUS_PROPOSED: "proposed", events_pb2.ITEM_STATUS_APPROVED: "approved",
               events_pb2.ITEM_STATUS_REJECTED: "rejected", events_pb2.ITEM_STATUS_PINNED: "pinned",
               events_pb2.ITEM_STATUS_UNSPECIFIED: "unknown"}
CURVE_METRICS = (("heldout", "rule_score", "held-out", True), ("ood", "rule_score", "OOD", True),
                 ("training_data", "hacking_flag_fraction", "hacking fraction", False))
"""Eval-gate results drawn on the learning curve: (suite, metric, label, whether the first version's
baseline, the base model's score, opens the line). One metric per line: a suite holds several results of
different scales (the OOD suite also has a log-likelihood and a repetition share); the table lists all."""


def _seconds(ts: Any) -> float:
    return float(ts.seconds) + ts.nanos / 1e9


def version_status(m: weights_pb2.Manifest) -> str:
    name = weights_pb2.VersionStatus.Name(m.status)
    return name.removeprefix("VERSION_STATUS_").lower()


def versions_view(manifests: list[weights_pb2.Manifest], status: weights_pb2.StatusResponse | None) -> dict[str, Any]:
    """Lineage, gate results and serving state of every version, oldest first, plus which pod serves what."""
    canary_fraction = status.canary_fraction if status is not None else 0.0
    canary_requests: dict[str, int] = {}
    for pod in status.pods if status is not None else []:
        if pod.canary_version:
            canary_requests[pod.canary_version] = canary_requests.get(pod.canary_version, 0) + pod.canary_requests
    rows = []
    ordered = sorted(manifests, key=lambda m: (_seconds(m.created_at), m.version))
    for m in ordered:
        rows.append({
            "version": m.version, "parent": m.parent_version or "base", "algorithm": m.algorithm, "kind": m.kind,
            "tenant": m.tenant, "status": version_status(m), "reason": m.status_reason, "pinned": m.pinned,
            "created_at": _seconds(m.created_at),
            "data_offsets": [{"topic": o.topic, "partition": o.partition, "start": o.start_offset, "end": o.end_offset}
                             for o in m.data_offsets],
            "train_metrics": dict(sorted(m.train_metrics.items())),
            "eval": [{"suite": r.suite, "metric": r.metric, "candidate": r.candidate, "baseline": r.baseline,
                      "threshold": r.threshold, "passed": r.passed, "detail": r.detail,
                      "comparison": r.comparison, "baseline_version": r.baseline_version} for r in m.eval_results],
            "canary": ({"fraction": canary_fraction, "requests": canary_requests.get(m.version, 0)}
                       if status is not None and m.version == status.canary_version else None)})
    curve = [{"label": label, "points": _curve_points(ordered, suite, metric, with_base)}
             for suite, metric, label, with_base in CURVE_METRICS]
    pods = []
    if status is not None:
        pods = [{"pod": p.pod_id, "serving": p.serving_version or "base", "canary": p.canary_version,
                 "tenants": dict(p.tenant_versions), "canary_requests": p.canary_requests,
                 "canary_errors": p.canary_errors, "converged": p.converged, "lagging": p.lagging,
                 "detail": p.detail or p.last_error, "heartbeat_age_s": p.heartbeat_age_s} for p in status.pods]
    return {"versions": rows, "curve": [c for c in curve if c["points"]], "pods": pods,
            "promoted": status.promoted_version if status is not None else "",
            "canary": status.canary_version if status is not None else "", "canary_fraction": canary_fraction,
            "tenant_versions": dict(status.tenant_versions) if status is not None else {}}


def _curve_points(ordered: list[weights_pb2.Manifest], suite: str, metric: str,
                  with_base: bool) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    for m in ordered:
        for r in m.eval_results:
            # one point per version: the gate records each regression check against the parent and the
            # reference (same candidate value); the parent's baseline is the previous point
            if r.suite == suite and r.metric == metric and r.comparison != "reference":
                if with_base and not points and (m.parent_version or "base") == "base":
                    points.append({"version": "base", "value": r.baseline})
                points.append({"version": m.version, "value": r.candidate})
    return points


def knowledge_view(snapshots: list[events_pb2.KnowledgeSnapshot]) -> list[dict[str, Any]]:
    """Every knowledge base with its items (pending ones first) and each item's provenance trail."""
    order = {"proposed": 0, "pinned": 1, "approved": 2, "rejected": 3, "unknown": 4}
    out = []
    for s in sorted(snapshots, key=lambda s: s.key):
        items = []
        for it in s.items:
            items.append({
                "id": it.item_id, "text": it.text, "status": ITEM_STATUS.get(it.status, "unknown"),
                "helpful": it.helpful, "harmful": it.harmful, "screen_flags": list(it.screen_flags),
                "created_by": it.created_by, "edited_by": it.edited_by,
                "sources": list(it.source_interaction_ids)[:5],
                "provenance": [{"action": p.action, "by": p.principal.key_id, "role": p.principal.role,
                                "source": p.source, "at": _seconds(p.at), "detail": p.detail}
                               for p in it.provenance]})
        items.sort(key=lambda i: (order[i["status"]], i["id"]))
        tenant = s.key.split("/", 1)[0]
        out.append({"key": s.key, "tenant": tenant, "domain": s.domain, "version": s.version,
                    "require_approval": s.require_approval, "change": s.change, "items": items,
                    "pending": sum(1 for i in items if i["status"] == "proposed")})
    return out
