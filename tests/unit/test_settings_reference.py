"""docs/settings.md is what tools/settings_reference.py writes from the settings classes (so it cannot drift
from the code), every variable has a description, no two settings of one service share a variable, and
secrets never show a value."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, Tag
from pydantic_settings import SettingsConfigDict

from shared.settings import ApprenticeSettings, Group, kind_discriminator
from tools import settings_reference as ref


def test_the_committed_reference_is_what_the_generator_writes() -> None:
    committed = ref.OUTPUT.read_text()
    assert committed == ref.render(ref.variables()), "docs/settings.md is stale: run `make settings-doc`"
    assert ref.main(["--check"]) == 0


def test_every_variable_has_a_description_type_and_default() -> None:
    for source, rows in ref.variables().items():
        assert rows, source
        for v in rows:
            assert v.description.strip(), f"{v.name} ({source}) has no docstring"
            assert v.type and v.default, v.name


def test_every_variable_is_unique_per_service_and_outside_the_other_prefixes() -> None:
    found = ref.variables()
    common = [v.name for v in found["common"]]
    prefixes = tuple(f"APPRENTICE_{s.upper()}_" for s in ref.SERVICES)
    assert not [n for n in common if n.startswith(prefixes)], "a common variable inside a service's prefix"
    for service in ref.SERVICES:
        names = [n.upper() for n in common + [v.name for v in found[service]]]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        assert all(v.name.startswith(f"APPRENTICE_{service.upper()}_") for v in found[service]), service


def test_the_reference_names_the_nested_groups() -> None:
    extractor = {v.name: v for v in ref.variables()["extractor"]}
    kind = extractor["APPRENTICE_EXTRACTOR_LLM__KIND"]
    assert (kind.type, kind.default) == ("`inference` \\| `openai` \\| `local`", "`inference`")
    assert extractor["APPRENTICE_EXTRACTOR_LLM__BASE_URL"].description.startswith("(kind `openai`)")
    assert "APPRENTICE_EXTRACTOR_LLM" not in extractor and "APPRENTICE_EXTRACTOR_OPENAI_MODEL" not in extractor


class _Plain(Group):
    kind: Literal["plain"] = "plain"
    """The kind."""

    wait_ms: int = 5
    """A wait."""


class _Keyed(Group):
    """Keyed access."""

    kind: Literal["keyed"]
    """The kind."""

    api_token: SecretStr = SecretStr("s3cr3t")
    """A key."""

    size: int = Field(default=3, json_schema_extra={"unit": "rows"})
    """A size whose name says no unit."""


class _Example(ApprenticeSettings):
    model_config = SettingsConfigDict(env_prefix="APPRENTICE_EX_")

    password: SecretStr = SecretStr("")
    """An unset secret."""

    cache: Path | None = None
    """A path."""

    access: Annotated[Annotated[_Plain, Tag("plain")] | Annotated[_Keyed, Tag("keyed")],
                      kind_discriminator("plain")] = Field(default_factory=_Plain)
    """How to get in."""


def test_secrets_units_and_kinds_on_a_small_class() -> None:
    rows = {v.name: v for v in ref.walk(_Example, "APPRENTICE_EX_", "ex")}
    assert rows["APPRENTICE_EX_PASSWORD"].default == "(unset)"
    assert rows["APPRENTICE_EX_ACCESS__API_TOKEN"].default == "(secret)"
    assert "s3cr3t" not in ref.render({"common": list(rows.values())})
    assert rows["APPRENTICE_EX_ACCESS__WAIT_MS"].unit == "ms"
    assert rows["APPRENTICE_EX_ACCESS__SIZE"].unit == "rows"
    assert rows["APPRENTICE_EX_CACHE"].type == "path (optional)"
    kind = rows["APPRENTICE_EX_ACCESS__KIND"]
    assert kind.type == "`plain` \\| `keyed`" and kind.default == "`plain`"
    assert kind.description.startswith("How to get in.") and "`keyed` = Keyed access" in kind.description
