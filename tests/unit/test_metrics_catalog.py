"""The metrics the services register: Prometheus naming conventions, and the provisioned Grafana dashboard
and Prometheus scrape config kept in step with them.

The metrics are collected from the code itself: every module under services/ and shared/ that builds a
prometheus_client Counter, Gauge, Histogram or Summary is imported and its collectors described, so a
metric added, renamed or removed anywhere is seen here without a list to maintain.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "compose" / "grafana" / "dashboards" / "apprentice.json"
PROVISIONING = REPO / "compose" / "grafana" / "provisioning"
PROMETHEUS = REPO / "compose" / "prometheus" / "prometheus.yml"
COMPOSE = REPO / "compose" / "docker-compose.yml"
METRICS_PORTS = {"inference": 9101, "grader": 9102, "extractor": 9103, "trainer": 9104, "weights": 9105}
DEFINES_METRIC = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"")


def metric_modules() -> list[str]:
    out = []
    for root in ("services", "shared"):
        for path in sorted((REPO / root).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "prometheus_client" in text and DEFINES_METRIC.search(text):
                out.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    return out


def registered() -> dict[str, tuple[str, str, list[str]]]:
    """family name --> (type, defining module, label names) of every collector the code defines."""
    out: dict[str, tuple[str, str, list[str]]] = {}
    for name in metric_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                for family in value.describe():
                    out[family.name] = (family.type, name, list(value._labelnames))
    return out


def sample_names(families: dict[str, tuple[str, str, list[str]]]) -> set[str]:
    """The series names a scrape can show for these families (what PromQL selects)."""
    suffixes = {"counter": ["_total", "_created"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count", "_created"],
                "summary": ["", "_sum", "_count", "_created"], "info": ["_info"]}
    return {name + s for name, (kind, _, _) in families.items() for s in suffixes.get(kind, [""])}


@pytest.fixture(scope="module")
def families() -> dict[str, tuple[str, str, list[str]]]:
    out = registered()
    assert len(out) > 60, sorted(out)             # the scan found the services' metrics modules
    return out


def test_every_service_has_metrics_in_a_module_the_scan_finds(families: dict[str, tuple[str, str, list[str]]]) -> None:
    prefixes = {name.split("_")[1] for name in families}
    assert {"inference", "grader", "extractor", "trainer", "weights"} <= prefixes


def test_names_follow_prometheus_conventions(families: dict[str, tuple[str, str, list[str]]]) -> None:
    problems = []
    for name, (kind, module, labels) in sorted(families.items()):
        where = f"{name} ({kind}, {module})"
        if not re.fullmatch(r"apprentice_[a-z][a-z0-9_]*", name):
            problems.append(f"{where}: not apprentice_<snake_case>")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{where}: only counters end in _total")
        if kind == "counter" and name.endswith(("_seconds_seconds", "_total_total")):
            problems.append(f"{where}: doubled suffix")
        if re.search(r"(time|duration|latency|_secs|_ms)$", name):
            problems.append(f"{where}: a duration is in _seconds")
        if re.search(r"_(steps|count|sum|bucket)$", name) and kind == "gauge" and "lifetime" not in name:
            problems.append(f"{where}: a running count is a counter (_total)")
        if {"name", "metric", "quantity"} & set(labels):
            problems.append(f"{where}: one metric per quantity, not a {labels} label")
    assert not problems, "\n".join(problems)


def test_label_values_have_no_spaces() -> None:
    """The label values the code writes for free-text outcomes (the grader's join notes)."""
    from services.grader.metrics import outcome_label
    from shared.metrics import label_value

    assert outcome_label("duplicate interaction") == "duplicate_interaction"
    assert outcome_label("waiting for the judge") == "waiting_for_the_judge"
    assert outcome_label("no grader config for acme/support") == "no_grader_config"   # no tenant in a label
    assert label_value("  Tick for a GONE key!! ") == "tick_for_a_gone_key"
    assert label_value("") == "unknown" and len(label_value("x" * 500)) == 64


# --- the Grafana dashboard ---------------------------------------------------------------------------
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "le", "inf", "nan"}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])          # collapsed rows keep their panels inside


def expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr")]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        if var.get("type") == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def metric_names_in(expr: str) -> set[str]:
    """Series names a PromQL expression selects: identifiers that are not functions, keywords, label
    names in by/without/on/ignoring lists, label matchers, strings, ranges or Grafana variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)                  # strings (label values, legends)
    e = re.sub(r"\{[^}]*\}", "", e)                             # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                            # ranges, $__rate_interval
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\w+", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue                                            # a function call or a keyword
        if re.fullmatch(r"\d*e\d*", m.group(0)):
            continue
        names.add(m.group(0))
    return names


def test_promql_parser_finds_metric_names() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, method) (rate(apprentice_x_seconds_bucket{method="Gen by"}'
            '[$__rate_interval]))) / on (job) group_left sum without (pod) (apprentice_y_total) > bool 1e3')
    assert metric_names_in(expr) == {"apprentice_x_seconds_bucket", "apprentice_y_total"}


def test_dashboard_queries_only_registered_metrics(families: dict[str, tuple[str, str, list[str]]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = sample_names(families)
    exprs = expressions(dashboard)
    assert len(exprs) >= 40
    unknown = {name: expr for expr in exprs for name in metric_names_in(expr) if name not in known}
    assert not unknown, f"the dashboard queries metrics no service registers: {unknown}"
    used = {n for e in exprs for n in metric_names_in(e)}
    # every service, and every per-step quantity of the trainer, is on the dashboard
    for service in METRICS_PORTS:
        assert any(n.startswith(f"apprentice_{service}_") for n in used), service
    for quantity in ("loss", "kl", "clip_fraction", "reward_mean", "reward_std", "tokens_per_second",
                     "response_length_tokens", "mean_staleness_versions"):
        assert f"apprentice_trainer_{quantity}" in used, quantity
    assert "apprentice_weights_eval_seconds_bucket" in used


def test_dashboard_is_provisioned_from_the_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "Apprentice" and "id" not in dashboard
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    datasources = [d for f in (PROVISIONING / "datasources").glob("*.yaml")
                   for d in yaml.safe_load(f.read_text())["datasources"]]
    prom = [d for d in datasources if d["type"] == "prometheus"]
    assert len(prom) == 1 and prom[0]["url"] == "http://prometheus:9090"
    for p in panels(dashboard):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == prom[0]["uid"], p["title"]
            assert all(t["datasource"]["uid"] == prom[0]["uid"] for t in p["targets"]), p["title"]
    providers = [p for f in (PROVISIONING / "dashboards").glob("*.yaml")
                 for p in yaml.safe_load(f.read_text())["providers"]]
    assert [p["type"] for p in providers] == ["file"]
    graf_mounts = {v.split(":")[0]: v.split(":")[1]
                   for v in yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]["volumes"]}
    assert providers[0]["options"]["path"] == graf_mounts["./grafana/dashboards"]


def test_prometheus_scrapes_every_service_metrics_port() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
            for job in config["scrape_configs"]}
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    for service, port in METRICS_PORTS.items():
        assert jobs[service] == [f"{service}:{port}"], jobs
        published = {p.split(":")[-1] for p in compose[service]["ports"]}
        assert str(port) in published, (service, compose[service]["ports"])
        settings = importlib.import_module(f"services.{service}.settings")
        cls = next(v for k, v in vars(settings).items() if k.endswith("Settings") and k.lower().startswith(service))
        assert cls.model_fields["metrics_port"].default == port, service
