"""Settings moved into nested groups (shared/settings.py `moved_settings`): an old flat name, as a variable
or as a keyword, stops the start with a message naming the new variable, instead of being ignored (which
would run the service on a default the operator did not choose). Then every service's moves, as shipped."""

from __future__ import annotations

import importlib
from typing import Annotated, Any, ClassVar, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_settings import SettingsConfigDict

from shared.settings import ApprenticeSettings, Group, SettingMoved, env_name
from shared.startup import EXIT_STARTUP_ERROR, exit_on_startup_error, one_line, startup_errors


class Sub(Group):
    size: int = 1


class Example(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_EXAMPLE_")

    sub: Sub = Sub()
    moved_settings: ClassVar[dict[str, str]] = {"sub_size": "sub.size", "sub": "sub.size"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SUB_SIZE", "SUB", "SUB__SIZE"):
        monkeypatch.delenv(f"APPRENTICE_EXAMPLE_{name}", raising=False)


def test_the_new_nested_variable_sets_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB__SIZE", "7")
    assert Example().sub.size == 7


def test_an_old_variable_stops_the_start_naming_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB_SIZE", "7")
    with pytest.raises(SettingMoved, match="APPRENTICE_EXAMPLE_SUB_SIZE was renamed: set APPRENTICE_EXAMPLE_SUB__SIZE"):
        Example()


def test_an_old_name_that_is_now_a_group_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`APPRENTICE_EXAMPLE_SUB=7` would otherwise fail as bad JSON for the group, naming no new variable."""
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB", "7")
    with pytest.raises(SettingMoved, match="set APPRENTICE_EXAMPLE_SUB__SIZE"):
        Example()


def test_an_empty_old_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB_SIZE", "")     # compose's `${VAR:-}`
    assert Example().sub.size == 1


def test_an_old_keyword_is_refused() -> None:
    old: dict[str, Any] = {"sub_size": 3}
    with pytest.raises(SettingMoved, match=r"Example\(sub_size=...\) is now sub.size"):
        Example(**old)


def test_a_typo_inside_a_group_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB__SIZ", "7")
    with pytest.raises(ValueError, match="sub.siz"):
        Example()


def test_a_moved_setting_is_a_startup_error_of_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB_SIZE", "7")
    with pytest.raises(startup_errors()) as caught:
        Example()
    assert one_line("example", caught.value).startswith("apprentice example: APPRENTICE_EXAMPLE_SUB_SIZE was renamed")


# --- the services' moves, as shipped -------------------------------------------------------------------
SERVICES = [("services.extractor.settings", "ExtractorSettings"), ("services.trainer.settings", "TrainerSettings"),
            ("services.inference.settings", "InferenceSettings"), ("services.weights.settings", "WeightsSettings")]


def _resolves(model: type[BaseModel], path: str) -> bool:
    """The dotted path names a field of `model` (through any member of a union)."""
    head, _, rest = path.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    members = [get_args(m)[0] if get_origin(m) is Annotated else m
               for m in (get_args(field.annotation) or (field.annotation,))]
    return any(_resolves(m, rest) for m in members if isinstance(m, type) and issubclass(m, BaseModel))


@pytest.mark.parametrize(("module", "cls_name"), SERVICES, ids=[m.split(".")[1] for m, _ in SERVICES])
def test_every_moved_service_setting_names_its_new_variable(module: str, cls_name: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cls = getattr(importlib.import_module(module), cls_name)
    prefix = cls.model_config["env_prefix"]
    assert cls.moved_settings, f"{cls_name} moved nothing"
    for old, new in cls.moved_settings.items():
        assert _resolves(cls, new), f"{old} -> {new}: no such setting"
        assert old not in cls.model_fields or "." in new and new.split(".")[0] == old, f"{old} is still a field"
        monkeypatch.setenv(prefix + old.upper(), "1")
        with pytest.raises(SettingMoved, match=env_name(prefix, new)):
            cls()
        monkeypatch.delenv(prefix + old.upper())


# --- a value the settings refuse: one line at start, a bug's ValidationError keeps its traceback ---------
class ExampleSettings(Example):
    """Named as every settings class is (`<Name>Settings`): what shared/startup.py recognises."""


@exit_on_startup_error("example")
def _start_example() -> int:
    ExampleSettings()
    return 0


def test_a_refused_value_is_one_line_naming_the_setting_not_the_value(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("APPRENTICE_EXAMPLE_SUB__SIZ", "hunter2")
    assert _start_example() == EXIT_STARTUP_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("apprentice example: invalid settings (ExampleSettings): sub.siz: ")
    assert "hunter2" not in err and "errors.pydantic.dev" not in err


def test_a_validation_error_of_data_is_not_a_startup_error() -> None:
    @exit_on_startup_error("example")
    def main() -> int:
        Sub.model_validate({"size": "many"})    # a model of data, not settings: a bug, with its traceback
        return 0

    with pytest.raises(ValidationError):
        main()
