"""`apprentice status`'s report (a dict, also printed as `--json`) --> the tables a person reads.

Pure formatting, no network: the report is collected by tools/stack/cli.py. One row per service
(health, pid, uptime, port, the version it serves, restarts, consumer lag of its groups), then the lag of
every consumer group per topic, so a stuck stage shows up as the row whose lag grows.
"""

from __future__ import annotations

import json
import time
from typing import Any

from shared.contracts.grader_waiting import describe

HEADER = ["SERVICE", "HEALTH", "PID", "UPTIME", "PORT", "VERSION", "RESTARTS", "LAG"]


def table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def uptime(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _lag_by_group(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    lag = report.get("lag") or {}
    return {g: t for g, t in lag.items() if isinstance(t, dict)}


def _service_lag(name: str, groups: dict[str, dict[str, int]]) -> str:
    """Total lag of the consumer groups whose id names the service ("-" when it has none)."""
    mine = [sum(t.values()) for g, t in groups.items() if name in g]
    return str(sum(mine)) if mine else "-"


def _version(name: str, report: dict[str, Any]) -> str:
    """What the service serves: the inference pods' versions, the weights store's promoted (and canary)
    version, the number of knowledge bases the extractor holds."""
    pods = report.get("pods") or {}
    if name == "inference" and "pods" in pods:
        served = sorted({p.get("serving") or "base" for p in pods["pods"].values()})
        return ",".join(served) if served else "no pod"
    if name == "weights" and "pods" in pods:
        promoted = f"promoted {pods.get('promoted') or 'base'}"
        return promoted + (f", canary {pods['canary']}" if pods.get("canary") else "")
    if name == "extractor":
        kb = report.get("knowledge")
        if isinstance(kb, dict) and "error" not in kb:
            return f"{len(kb)} knowledge base{'s' if len(kb) != 1 else ''}"
    return "-"


def _port(s: dict[str, Any]) -> str:
    ports = s.get("ports") or {}
    return ", ".join(f"{k} {v}" for k, v in ports.items() if v) or "-"


def render_status(report: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    b = report["broker"]
    groups = _lag_by_group(report)
    lines = [f"broker   {'up' if b['up'] else 'DOWN'} at {b['bootstrap']}"]
    sup = report.get("supervisor") or {}
    lines.append(f"stack    {'supervisor pid ' + str(sup['pid']) if sup.get('pid') else 'not running here'}")
    rows = [HEADER]
    for name, s in report["services"].items():
        supervised = "pid" in s
        pid = s.get("pid")
        started = s.get("started_at") if pid else None
        restarts = str(s.get("restarts", 0)) + (f" (exits {s['exits']})" if s.get("exits") else "")
        rows.append([name, "healthy" if s["healthy"] else "DOWN", str(pid) if pid else "-",
                     uptime(now - started if started else None), _port(s), _version(name, report),
                     restarts if supervised else "-", _service_lag(name, groups)])
    lines += ["", *table(rows)]
    pods = report.get("pods") or {}
    if "pods" in pods:
        for pod_id, p in pods["pods"].items():
            lines.append(f"pod {pod_id}: serving {p['serving'] or 'base'}"
                         + (f", per tenant {p['tenants']}" if p.get("tenants") else "")
                         + (" (LAGGING)" if p.get("lagging") else ""))
        if not pods.get("converged", True):
            lines.append("pods NOT converged on the promoted version")
    elif pods:
        lines.append(f"versions unavailable: {json.dumps(pods)}")
    kb = report.get("knowledge")
    if isinstance(kb, dict) and kb and "error" not in kb:
        lines.append("knowledge " + ", ".join(f"{k} v{v.get('version')} ({v.get('items')} items)" for k, v in kb.items()))
    elif isinstance(kb, dict) and "error" in kb:
        lines.append(f"knowledge unavailable: {kb['error']}")
    if "grader_waiting" in report:
        lines += describe(report["grader_waiting"])
    spool = report.get("spool_depth")
    lines.append(f"spool    {spool:g} events not yet acknowledged" if spool is not None else "spool    n/a")
    lag = report.get("lag") or {}
    if "error" in lag:
        lines.append(f"lag      unavailable: {lag['error']}")
    elif groups:
        lag_rows = [["GROUP", "TOPIC", "LAG"]] + [[g, topic, str(n)] for g, t in sorted(groups.items())
                                                  for topic, n in sorted(t.items())]
        lines += ["", *table(lag_rows)]
    return "\n".join(lines)
