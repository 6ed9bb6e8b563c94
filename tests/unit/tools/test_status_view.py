"""`apprentice status` tables from a report (the dict `--json` prints): one row per service with health,
pid, uptime, port, served version, restarts and lag; a lag table per group and topic."""

from __future__ import annotations

from tools.stack.status_view import render_status, uptime

NOW = 1_000_000.0


def _report() -> dict[str, object]:
    svc = {"restarts": 0, "exits": [], "log": "/x"}
    return {
        "broker": {"bootstrap": "127.0.0.1:9092", "up": True},
        "supervisor": {"pid": 4242, "ports": {}},
        "services": {
            "inference": {"healthy": True, "pid": 101, "started_at": NOW - 125, **svc,
                          "ports": {"grpc": 50051, "http": 8000}},
            "grader": {"healthy": True, "pid": 102, "started_at": NOW - 3700, **svc, "ports": {"metrics": 9102}},
            "extractor": {"healthy": True, "pid": 103, "started_at": NOW - 5, **svc, "ports": {"grpc": 50053}},
            "trainer": {"healthy": False, "pid": None, "started_at": NOW - 9, "restarts": 3, "exits": [1, 1, 1],
                        "log": "/x", "ports": {"metrics": 9104}},
            "weights": {"healthy": True, "pid": 105, "started_at": NOW - 90000, **svc, "ports": {"grpc": 50052}},
        },
        "spool_depth": 0.0,
        "pods": {"promoted": "v2", "canary": "v3", "converged": True,
                 "pods": {"pod-0": {"serving": "v2", "tenants": {}, "lagging": False}}},
        "knowledge": {"demo/support": {"version": 4, "items": 7}},
        "lag": {"grader-interactions": {"apprentice.interactions.v1": 5, "apprentice.feedback.v1": 1},
                "trainer-demo": {"apprentice.graded.v1": 12}},
    }


def test_service_table_columns_and_values() -> None:
    text = render_status(_report(), now=NOW)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("SERVICE"))
    assert header.split() == ["SERVICE", "HEALTH", "PID", "UPTIME", "PORT", "VERSION", "RESTARTS", "LAG"]
    rows = {line.split()[0]: line for line in lines[lines.index(header) + 1:lines.index(header) + 6]}
    assert set(rows) == {"inference", "grader", "extractor", "trainer", "weights"}
    assert rows["inference"].split()[:4] == ["inference", "healthy", "101", "2m05s"]
    assert "grpc 50051, http 8000" in rows["inference"] and " v2 " in rows["inference"]
    assert "1h01m" in rows["grader"] and rows["grader"].rstrip().endswith("6")      # 5 + 1 lag of its group
    assert "promoted v2, canary v3" in rows["weights"] and "1d01h" in rows["weights"]
    assert "1 knowledge base" in rows["extractor"]
    assert rows["trainer"].split()[:4] == ["trainer", "DOWN", "-", "-"] and "3 (exits [1, 1, 1])" in rows["trainer"]
    # columns line up: every row starts its HEALTH cell where the header does
    col = header.index("HEALTH")
    assert all(r[col - 2:col] == "  " and r[col] != " " for r in rows.values())


def test_lag_table_and_other_lines() -> None:
    text = render_status(_report(), now=NOW)
    assert "broker   up at 127.0.0.1:9092" in text and "supervisor pid 4242" in text
    assert "pod pod-0: serving v2" in text and "demo/support v4 (7 items)" in text
    lag = text[text.index("GROUP"):].splitlines()
    assert lag[0].split() == ["GROUP", "TOPIC", "LAG"]
    assert [r.split() for r in lag[1:]] == [["grader-interactions", "apprentice.feedback.v1", "1"],
                                            ["grader-interactions", "apprentice.interactions.v1", "5"],
                                            ["trainer-demo", "apprentice.graded.v1", "12"]]


def test_nothing_running() -> None:
    report = _report()
    report.update(broker={"bootstrap": "127.0.0.1:9", "up": False}, supervisor={"pid": None, "ports": {}},
                  pods={"error": "UNAVAILABLE"}, knowledge={"error": "UNAVAILABLE"}, spool_depth=None, lag=None)
    report["services"] = {n: {"healthy": False, "ports": {"grpc": 1}} for n in ("inference", "weights")}
    text = render_status(report, now=NOW)
    assert "broker   DOWN at 127.0.0.1:9" in text and "not running here" in text
    assert "versions unavailable" in text and "knowledge unavailable: UNAVAILABLE" in text and "spool    n/a" in text
    row = next(line for line in text.splitlines() if line.startswith("weights"))
    assert row.split()[:4] == ["weights", "DOWN", "-", "-"]


def test_uptime_format() -> None:
    assert [uptime(s) for s in (None, -1, 0, 59, 60, 3599, 3600, 86399, 86400 * 3 + 7200)] == \
        ["-", "-", "0s", "59s", "1m00s", "59m59s", "1h00m", "23h59m", "3d02h"]
