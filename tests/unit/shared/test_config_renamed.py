"""Renamed settings (shared/settings.py `renamed`, `renamed_env`): an old name, as a constructor keyword or
an environment variable, still sets the new field for one release, warns (DeprecationWarning and a log
line) naming the new one, and never wins over the new name. Then every service's renames, as shipped."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import renamed, renamed_env


class Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_EXAMPLE_", extra="ignore")

    port: int = 1
    weights_endpoint: str = "default:1"

    _old_names = renamed(grpc_port="port", weights_target="weights_endpoint")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "GRPC_PORT", "WEIGHTS_ENDPOINT", "WEIGHTS_TARGET"):
        monkeypatch.delenv(f"APPRENTICE_EXAMPLE_{name}", raising=False)


def test_the_new_names_need_no_warning(monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_PORT", "7")
    s = Example(weights_endpoint="w:2")
    assert (s.port, s.weights_endpoint) == (7, "w:2")
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_an_old_environment_variable_sets_the_new_field_and_warns(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_GRPC_PORT", "50099")
    with caplog.at_level(logging.WARNING, logger="shared.settings"), \
            pytest.warns(DeprecationWarning, match="APPRENTICE_EXAMPLE_GRPC_PORT is deprecated.*use APPRENTICE_EXAMPLE_PORT"):
        s = Example()
    assert s.port == 50099                          # parsed as the new field's type
    assert any("APPRENTICE_EXAMPLE_GRPC_PORT is deprecated" in r.getMessage() and "APPRENTICE_EXAMPLE_PORT" in
               r.getMessage() for r in caplog.records)


def test_an_old_lower_case_variable_counts_as_pydantic_settings_reads_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("apprentice_example_weights_target", "lower:5")
    with pytest.warns(DeprecationWarning, match="use APPRENTICE_EXAMPLE_WEIGHTS_ENDPOINT"):
        assert Example().weights_endpoint == "lower:5"


def test_an_old_constructor_keyword_sets_the_new_field_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"Example\(weights_target=\.\.\.\) is deprecated.*Example\(weights_endpoint=\.\.\.\)"):
        old: dict[str, Any] = {"weights_target": "kw:3"}   # the old keyword, as an untyped caller passes it
        s = Example(**old)
    assert s.weights_endpoint == "kw:3"


def test_the_new_name_wins_over_the_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_GRPC_PORT", "2")
    monkeypatch.setenv("APPRENTICE_EXAMPLE_PORT", "3")
    with pytest.warns(DeprecationWarning, match="is set too and wins"):
        assert Example().port == 3
    with pytest.warns(DeprecationWarning, match="is set too and wins"):
        both: dict[str, Any] = {"grpc_port": 4, "port": 5}
        assert Example(**both).port == 5


def test_an_empty_old_variable_carries_nothing(monkeypatch: pytest.MonkeyPatch,
                                               recwarn: pytest.WarningsRecorder) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_WEIGHTS_TARGET", "")     # compose's `${VAR:-}`
    assert Example().weights_endpoint == "default:1"
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_an_invalid_old_value_fails_as_the_new_field_would(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("APPRENTICE_EXAMPLE_GRPC_PORT", "not-a-port")
    with pytest.warns(DeprecationWarning), pytest.raises(ValidationError, match="port"):
        Example()


def test_renamed_env_reads_the_new_variable_then_the_old_one_then_the_default() -> None:
    assert renamed_env("NEW", "OLD", "d", {"NEW": "n", "OLD": "o"}) == "n"
    with pytest.warns(DeprecationWarning, match="OLD is deprecated.*use NEW"):
        assert renamed_env("NEW", "OLD", "d", {"OLD": "o"}) == "o"
    assert renamed_env("NEW", "OLD", "d", {}) == "d"


# --- the services' renames, as shipped ----------------------------------------------------------------
RENAMES = [
    ("services.extractor.settings", "ExtractorSettings", "APPRENTICE_EXTRACTOR_", {
        "grpc_port": ("port", "50999", 50999), "grpc_host": ("host", "127.0.0.2", "127.0.0.2"),
        "target": ("endpoint", "x:1", "x:1")}),
    ("services.dashboard.settings", "DashboardSettings", "APPRENTICE_DASHBOARD_", {
        "weights_target": ("weights_endpoint", "w:3", "w:3"),
        "knowledge_target": ("extractor_endpoint", "k:4", "k:4"),
        "inference_target": ("inference_endpoint", "i:5", "i:5")}),
]


@pytest.mark.parametrize(("module", "cls_name", "prefix", "renames"), RENAMES, ids=["extractor", "dashboard"])
def test_every_renamed_service_setting_still_reads_its_old_variable(
        module: str, cls_name: str, prefix: str, renames: dict[str, tuple[str, str, object]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    cls = getattr(importlib.import_module(module), cls_name)
    for old, (new, raw, _value) in renames.items():
        monkeypatch.delenv(prefix + new.upper(), raising=False)
        monkeypatch.setenv(prefix + old.upper(), raw)
    with pytest.warns(DeprecationWarning) as record:
        s = cls()
    for old, (new, _raw, value) in renames.items():
        assert getattr(s, new) == value, old
        assert not hasattr(s, old), f"{old} is still a field"
        assert any(f"{prefix}{old.upper()} is deprecated" in str(w.message) and f"{prefix}{new.upper()}"
                   in str(w.message) for w in record), old
