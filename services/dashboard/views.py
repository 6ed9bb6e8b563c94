"""Weights manifests, pod status and knowledge snapshots (protos from the services' gRPC APIs) --> the
JSON the pages draw. Pure conversions, no network: the gRPC calls are in `backends.py`."""

from __future__ import annotations

from typing import Any

from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import events_pb2, weights_pb2

ITEM_STATUS = {events_pb2.ITEM_STATUS_PROPOSED: "proposed", events_pb2.ITEM_STATUS_APPROVED: "approved",
               events_pb2.ITEM_STATUS_REJECTED: "rejected", events_pb2.ITEM_STATUS_PINNED: "pinned",
               events_pb2.ITEM_STATUS_CONSOLIDATED: "consolidated", events_pb2.ITEM_STATUS_RETIRED: "retired",
               events_pb2.ITEM_STATUS_UNSPECIFIED: "unknown"}
STATES = {"proposed": "pending", "approved": "serving in context", "pinned": "serving in context",
          "consolidated": "consolidated", "retired": "retired", "rejected": "rejected", "unknown": "unknown"}
"""Status --> the state an operator reads: approved and pinned items are put into relevant requests' prompts
("serving in context"); a consolidated one is answered by the weights of a promoted version instead."""
STATE_ORDER = ("pending", "serving in context", "consolidated", "retired", "rejected")
STATUS_ORDER = {"proposed": 0, "pinned": 1, "approved": 2, "consolidated": 3, "retired": 4, "rejected": 5,
                "unknown": 6}
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


WEIGHTS_ACTIONS = ("promote", "canary", "rollback")


def served_for(status: weights_pb2.StatusResponse | None, tenant: str) -> str:
    """The version `tenant`'s slot serves outside any canary: its own, else the operator slot's (""), else
    the base (shared/contracts/orders.py `promoted_for`, from the weights service's status)."""
    if status is None:
        return BASE
    slots = dict(status.tenant_versions)
    return slots.get(tenant) or slots.get("") or status.promoted_version or BASE


def canary_for(status: weights_pb2.StatusResponse | None, tenant: str) -> str:
    """The canary running in `tenant`'s own slot ("" = none); slots never share canaries."""
    if status is None:
        return ""
    if status.tenant_canaries:
        return status.tenant_canaries.get(tenant, "")
    return "" if tenant else status.canary_version


def _slot_name(tenant: str) -> str:
    return f"tenant {tenant}" if tenant else "every tenant"


def version_actions(m: weights_pb2.Manifest, stored: set[str],
                    status: weights_pb2.StatusResponse | None) -> tuple[list[str], dict[str, str]]:
    """The weights orders (`POST /api/weights/{action}`) that can succeed on version `m` as the dashboard
    sends them (never with force), and for each other one why not, in the words of the row's note. The
    weights service's rules (services/weights/orders.py): promote and canary pass the eval gate (a candidate
    is evaluated first; rejected and rolled-back versions are refused), neither for the base or a version its
    slot serves already, nor for a LoRA whose base version is not stored; a rollback to a version goes to
    that version's slot, is refused for a rejected one and for the one its slot serves when no canary runs
    there (with one, it ends the canary); a version with non-finite weights is never served."""
    version, tenant = m.version, m.tenant
    serving, canary = served_for(status, tenant), canary_for(status, tenant)
    served = f"served now ({_slot_name(tenant)})"
    why: dict[str, str] = {}
    integrity = next((r for r in m.eval_results if r.suite == "integrity" and r.metric == "nonfinite_tensors"), None)
    if integrity is not None and not integrity.passed:
        return [], dict.fromkeys(WEIGHTS_ACTIONS, "non-finite weights: never served")
    state = version_status(m)
    if version == BASE:
        why["promote"] = "the base: serve it with a rollback to it"
        why["canary"] = "the base cannot be a canary"
    else:
        refused = {"rejected": "rejected by the eval gate",
                   "rolled_back": "rolled back (the CLI's promote --force serves it again)"}.get(state, "")
        if not refused and m.kind == "lora" and m.base_version not in ("", BASE) and m.base_version not in stored:
            refused = f"its base version {m.base_version} is not stored"
        if not refused and serving == version:
            refused = served
        if refused:
            why["promote"] = why["canary"] = refused
    if state == "rejected":
        why["rollback"] = "rejected by the eval gate"
    elif serving == version and not canary:
        why["rollback"] = served
    return [a for a in WEIGHTS_ACTIONS if a not in why], why


def promoted_text(status: weights_pb2.StatusResponse | None) -> str:
    """What is promoted, in words: the operator slot's version alone ("base", "v3") when no tenant has a
    slot of its own, else each tenant slot's and the operator slot's for every other tenant:
    "v3 for tenant shop · base for every other tenant"."""
    default = served_for(status, "")
    own = sorted((t, v) for t, v in (status.tenant_versions.items() if status is not None else []) if t and v)
    if not own:
        return default
    return " · ".join([*(f"{v} for tenant {t}" for t, v in own), f"{default} for every other tenant"])


def versions_view(manifests: list[weights_pb2.Manifest], status: weights_pb2.StatusResponse | None) -> dict[str, Any]:
    """Lineage, gate results and serving state of every version, oldest first, with the actions that can
    succeed on each (and why the others cannot), plus which pod serves what."""
    stored = {m.version for m in manifests}
    canary_fraction = status.canary_fraction if status is not None else 0.0
    canary_requests: dict[str, int] = {}
    for pod in status.pods if status is not None else []:
        if pod.canary_version:
            canary_requests[pod.canary_version] = canary_requests.get(pod.canary_version, 0) + pod.canary_requests
    rows = []
    ordered = sorted(manifests, key=lambda m: (_seconds(m.created_at), m.version))
    for m in ordered:
        actions, not_offered = version_actions(m, stored, status)
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
                       if status is not None and m.version == status.canary_version else None),
            "serving": served_for(status, m.tenant) == m.version, "slot_canary": canary_for(status, m.tenant),
            "actions": actions, "not_offered": not_offered})
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
            "promoted_text": promoted_text(status),
            "canary": status.canary_version if status is not None else "", "canary_fraction": canary_fraction,
            "tenant_versions": dict(status.tenant_versions) if status is not None else {},
            "tenant_canaries": {t: v for t, v in sorted(status.tenant_canaries.items()) if t and v}
            if status is not None else {}}


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


def item_actions(it: events_pb2.KnowledgeItem, status: str) -> list[str]:
    """The item actions (`POST /api/knowledge/{action}`) that can succeed in the item's state, as the
    dashboard sends them: never with the injection-screen override, which approving, pinning or restoring a
    flagged item needs (the CLI's `--override-screen`, after reading it); rejecting, retiring and editing
    take it out of service and need none. Splits are per merge."""
    actions = {"proposed": ["approve", "reject"], "approved": ["retire"], "pinned": ["retire"],
               "consolidated": ["retire"], "retired": ["restore"]}.get(status, [])
    if it.screen_flags:
        actions = [a for a in actions if a in ("reject", "retire")]
    return [*actions, "edit"]


def _merges(it: events_pb2.KnowledgeItem, texts: set[str]) -> list[dict[str, Any]]:
    """Each merge into the item, oldest first: the duplicate's own text (empty for an exact restatement, which
    cannot be split off), its sources and time; `can_split` until that text was split off (a `split` entry
    after it) or is an item of the base again."""
    out: list[dict[str, Any]] = []
    entries = list(it.provenance)
    for n, p in enumerate(entries):
        if p.action != "merged":
            continue
        text = p.text.strip()
        split = bool(text) and any(q.action == "split" and q.text.strip() == text for q in entries[n + 1:])
        out.append({"text": p.text, "sources": list(p.interaction_ids), "at": _seconds(p.at),
                    "by": p.principal.key_id, "role": p.principal.role, "source": p.source, "split": split,
                    "can_split": bool(text) and not split and text not in texts})
    return out


def knowledge_view(snapshots: list[events_pb2.KnowledgeSnapshot]) -> list[dict[str, Any]]:
    """Every knowledge base with its items (pending ones first), each with its state, questions and answer
    terms, provenance trail, merges and supersession, and the actions that can succeed on it; counts per state."""
    out = []
    for s in sorted(snapshots, key=lambda s: s.key):
        by_id = {it.item_id: it for it in s.items}
        texts = {it.text.strip() for it in s.items}
        supersedes: dict[str, list[dict[str, str]]] = {}
        for it in s.items:
            if it.status == events_pb2.ITEM_STATUS_RETIRED and it.superseded_by:
                supersedes.setdefault(it.superseded_by, []).append({"id": it.item_id, "text": it.text})
        items = []
        for it in s.items:
            status = ITEM_STATUS.get(it.status, "unknown")
            state = STATES[status]
            detail = {"pinned": "pinned", "consolidated": f"in {it.consolidated_in}" if it.consolidated_in else "",
                      "retired": f"superseded by {it.superseded_by}" if it.superseded_by else it.retired_reason,
                      "approved": f"back from consolidation: {it.lost_in} does not answer it" if it.lost_in else ""}.get(status, "")
            newer = by_id.get(it.superseded_by) if it.superseded_by else None
            merges = _merges(it, texts)
            items.append({
                "id": it.item_id, "text": it.text, "status": status, "state": state, "state_detail": detail,
                "revision": it.revision, "helpful": it.helpful, "harmful": it.harmful,
                "screen_flags": list(it.screen_flags), "created_by": it.created_by, "edited_by": it.edited_by,
                "sources": list(it.source_interaction_ids)[:5],
                "questions": list(it.questions), "answer_terms": list(it.answer_terms),
                "consolidated_in": it.consolidated_in, "lost_in": it.lost_in, "retired_reason": it.retired_reason,
                "superseded_by": ({"id": it.superseded_by, "text": newer.text if newer is not None else "",
                                   "status": ITEM_STATUS.get(newer.status, "unknown") if newer is not None else ""}
                                  if it.superseded_by else None),
                "supersedes": supersedes.get(it.item_id, []),
                "merges": merges, "actions": item_actions(it, status),
                "provenance": [{"action": p.action, "by": p.principal.key_id, "role": p.principal.role,
                                "source": p.source, "at": _seconds(p.at), "detail": p.detail}
                               for p in it.provenance]})
        items.sort(key=lambda i: (STATUS_ORDER[i["status"]], i["id"]))
        counts = dict.fromkeys(STATE_ORDER, 0)
        for i in items:
            counts[i["state"]] = counts.get(i["state"], 0) + 1
        tenant = s.key.split("/", 1)[0]
        out.append({"key": s.key, "tenant": tenant, "domain": s.domain, "version": s.version,
                    "require_approval": s.require_approval, "change": s.change, "items": items,
                    "pending": counts["pending"], "counts": counts})
    return out
