"""Grader-config YAML: the default file, task resolution, and errors that say where and what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.grader.settings import DEFAULT_CONFIG, GraderSettings
from shared.grading import GraderConfigError, KpiSpec, load_grader_config, parse_grader_config


def test_default_config_has_the_demo_task() -> None:
    cfg = load_grader_config(DEFAULT_CONFIG)
    demo = cfg.for_task("demo", "support")
    assert demo is not None and demo.tenant == "demo"
    kpi = next(g for g in demo.graders if isinstance(g, KpiSpec))
    assert kpi.kpi == "resolved" and kpi.success and kpi.map == {1.0: 1.0, 0.0: 0.0}
    assert demo.needs_feedback and [g.name for g in demo.feedback_graders] == ["resolved"]
    catch_all = cfg.for_task("acme", "billing")
    assert catch_all is not None and (catch_all.tenant, catch_all.task) == ("*", "*")
    # a correction ends the wait of a task without rules (a -1, as a thumbs down); KPIs need a rule
    assert {g.kind for g in catch_all.feedback_graders} == {"thumbs", "rating", "correction"}  # type: ignore[union-attr]
    assert catch_all.emit_when == "any_feedback"


def test_most_specific_task_entry_wins() -> None:
    g = [{"name": "t", "type": "feedback", "kind": "thumbs"}]
    cfg = parse_grader_config({"version": "1", "tasks": [
        {"tenant": "*", "task": "*", "graders": g}, {"tenant": "a", "task": "*", "graders": g},
        {"tenant": "*", "task": "x", "graders": g}, {"tenant": "a", "task": "x", "graders": g}]})

    def entry(tenant: str, task: str) -> tuple[str, str]:
        m = cfg.for_task(tenant, task)
        assert m is not None
        return m.tenant, m.task

    assert entry("a", "x") == ("a", "x")
    assert entry("a", "y") == ("a", "*")
    assert entry("b", "x") == ("*", "x")
    assert entry("b", "y") == ("*", "*")
    assert parse_grader_config({"version": "1", "tasks": [{"tenant": "a", "task": "x", "graders": g}]}) \
        .for_task("b", "x") is None


@pytest.mark.parametrize(("doc", "where", "what"), [
    ({"tasks": []}, "version", "Field required"),
    ({"version": "1", "tasks": [{"graders": []}]}, "tasks.0.graders", "at least 1 item"),
    ({"version": "1", "tasks": [{"graders": [{"name": "a", "type": "regex", "pattern": "[a"}]}]},
     "tasks.0.graders.0.regex.pattern", "invalid regular expression"),
    ({"version": "1", "tasks": [{"graders": [{"name": "a", "type": "thumbs"}]}]}, "tasks.0.graders.0",
     "does not match any of the expected tags"),
    ({"version": "1", "tasks": [{"graders": [{"name": "a", "type": "kpi", "kpi": "k", "weight": -1}]}]},
     "tasks.0.graders.0.kpi.weight", "greater than or equal to 0"),
    ({"version": "1", "tasks": [{"graders": [{"name": "a", "type": "kpi", "kpi": "k", "colour": "red"}]}]},
     "tasks.0.graders.0.kpi.colour", "Extra inputs are not permitted"),
    ({"version": "1", "tasks": [{"graders": [{"name": "a", "type": "kpi", "kpi": "k"},
                                             {"name": "a", "type": "feedback", "kind": "thumbs"}]}]},
     "tasks.0", "repeated: a"),
    ({"version": "1", "tasks": [{"feedback_mode": "required",
                                 "graders": [{"name": "a", "type": "regex", "pattern": "x"}]}]},
     "tasks.0", "feedback_mode 'required' needs a feedback or kpi grader"),
    ({"version": "1", "tasks": [{"feedback_window_s": 0, "graders": [{"name": "a", "type": "regex",
                                                                      "pattern": "x"}]}]},
     "tasks.0.feedback_window_s", "greater than 0"),
    ({"version": "1", "detectors": {"length_corr_threshold": 2},
      "tasks": [{"graders": [{"name": "a", "type": "regex", "pattern": "x"}]}]},
     "detectors.length_corr_threshold", "less than or equal to 1"),
])
def test_config_errors_name_the_place(doc: dict, where: str, what: str) -> None:
    with pytest.raises(GraderConfigError) as e:
        parse_grader_config(doc, source="grader.yaml")
    msg = str(e.value)
    assert msg.startswith("invalid grader config grader.yaml:")
    assert f"  {where}: " in msg and what in msg, msg


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(GraderConfigError, match="cannot read grader config"):
        load_grader_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntasks: [\n")
    with pytest.raises(GraderConfigError, match="not valid YAML"):
        load_grader_config(bad)
    bad.write_text("- just a list\n")
    with pytest.raises(GraderConfigError, match="top level must be a mapping"):
        load_grader_config(bad)


def test_settings_namespaces_app_id_with_the_topic_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "test-abc.")
    s = GraderSettings()
    assert s.app_id == "test-abc.apprentice-grader"
    assert s.join_topic.startswith("test-abc.") and s.judge_topic.startswith("test-abc.")


def test_a_native_runtime_left_in_the_environment_stops_the_start_and_faust_is_only_warned_about(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The removed runtime choice (settings.py says why native refuses and faust warns)."""
    from shared.settings import SettingMoved
    from shared.startup import one_line

    monkeypatch.setenv("APPRENTICE_GRADER_RUNTIME", "native")
    with pytest.raises(SettingMoved, match="APPRENTICE_GRADER_RUNTIME=native asks for a runtime that was removed") as e:
        GraderSettings()
    assert "\n" not in one_line("grader", e.value)
    monkeypatch.setenv("apprentice_grader_runtime", "Native")  # read without regard to case, as pydantic does
    monkeypatch.delenv("APPRENTICE_GRADER_RUNTIME")
    with pytest.raises(SettingMoved):
        GraderSettings()
    monkeypatch.delenv("apprentice_grader_runtime")
    for name, value in (("APPRENTICE_GRADER_RUNTIME", "faust"), ("APPRENTICE_GRADER_SHUTDOWN_GRACE_S", "5"),
                        ("APPRENTICE_GRADER_TRANSACTION_TIMEOUT_S", "10")):
        monkeypatch.setenv(name, value)
        caplog.clear()
        with caplog.at_level("WARNING", logger="services.grader.settings"):
            s = GraderSettings()
        assert f"{name} is no longer read" in caplog.text
        assert not hasattr(s, name.removeprefix("APPRENTICE_GRADER_").lower())
        monkeypatch.delenv(name)
    caplog.clear()
    with caplog.at_level("WARNING", logger="services.grader.settings"):
        GraderSettings()
    assert caplog.text == ""


def test_fault_injection_points_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    for ok in ("", "after_state:2", "after_emit:1", "fail_after_state:3"):
        monkeypatch.setenv("APPRENTICE_GRADER_FAULT_INJECTION", ok)
        assert GraderSettings().fault_injection == ok
    monkeypatch.setenv("APPRENTICE_GRADER_FAULT_INJECTION", "after_lunch:1")
    with pytest.raises(ValidationError, match="fault_injection must be"):
        GraderSettings()


def test_the_internal_topics_created_before_faust_starts_are_the_ones_faust_uses(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """stream/internal_topics.py creates the changelogs under the settings' names: faust's own for its tables."""
    from services.grader.stream.app import GraderApp

    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "test-xyz.")
    monkeypatch.setenv("APPRENTICE_HOME", str(tmp_path))
    monkeypatch.setenv("APPRENTICE_RECORD_SIGNATURES", "off")  # no keys under this home; not what is tested
    s = GraderSettings()
    faust_app = GraderApp(s, load_grader_config(DEFAULT_CONFIG))
    assert faust_app.table.changelog_topic.get_topic_name() == s.pending_changelog
    assert faust_app.judge_table.changelog_topic.get_topic_name() == s.judge_changelog
    assert faust_app.app.conf.id == s.app_id  # the consumer group
