"""Every setting's variable, from the settings classes themselves --> docs/settings.md.

The settings classes (shared/settings.py `CommonSettings` and each services/<name>/settings.py) are the
only place a setting is declared; their attribute docstrings are the descriptions (pydantic keeps them:
`use_attribute_docstrings`). This walks them, nested groups and choices of kind included, so the reference
cannot say something the code does not read. tests/unit/test_settings_reference.py fails when the committed
file differs from what this writes.

    .venv/bin/python -m tools.settings_reference           # rewrite docs/settings.md (make settings-doc)
    .venv/bin/python -m tools.settings_reference --check   # exit 1 when docs/settings.md is stale
"""

from __future__ import annotations

import argparse
import enum
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "settings.md"

SERVICES = ("inference", "grader", "extractor", "trainer", "weights", "dashboard")
"""Each reads CommonSettings and its own services/<name>/settings.py."""

SOURCES: tuple[tuple[str, str, str], ...] = (
    ("common", "shared.settings", "CommonSettings"),
    *((name, f"services.{name}.settings", f"{name.capitalize()}Settings") for name in SERVICES),
)

UNIT_SUFFIXES = (("_per_s", "per s"), ("_ms", "ms"), ("_s", "s"), ("_bytes", "bytes"), ("_mb", "MiB"),
                 ("_chars", "characters"), ("_tokens", "tokens"))
"""Unit by the name's last word (first match wins: `_per_s` before `_s`); a field whose name does not say
it declares `json_schema_extra={"unit": ...}`."""

SECRET_NAMES = ("password", "secret", "_token", "auth_keys", "api_keys")
"""A field whose type is SecretStr or whose name ends with one of these never shows a default value."""


@dataclass(frozen=True)
class Variable:
    """One environment variable, as docs/settings.md prints it."""

    name: str
    type: str
    default: str
    unit: str
    read_by: str
    description: str


def settings_class(module: str, name: str) -> type[BaseModel]:
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and issubclass(cls, BaseModel), f"{module}.{name} is not a settings class"
    return cls


def _strip_annotated(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def _union_members(tp: Any) -> tuple[Any, ...]:
    tp = _strip_annotated(tp)
    if get_origin(tp) in (Union, types.UnionType):
        return tuple(_strip_annotated(a) for a in get_args(tp))
    return (tp,)


def groups_of(annotation: Any) -> list[type[BaseModel]]:
    """The nested groups a field holds: one model, or the members of a choice of kind; [] for a leaf."""
    members = [m for m in _union_members(annotation) if m is not type(None)]
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    return models if models and len(models) == len(members) else []


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: `a` | `b` for a choice, `x`? for an optional one."""
    members = _union_members(annotation)
    optional = type(None) in members
    parts: list[str] = []
    for m in members:
        if m is type(None):
            continue
        origin = get_origin(m)
        if origin is Literal:
            parts.extend(f"`{a}`" for a in get_args(m))
        elif isinstance(m, type) and issubclass(m, enum.Enum):
            parts.extend(f"`{e.value}`" for e in m)
        elif origin is dict:
            parts.append("JSON object")
        elif origin is list:
            parts.append("list")
        elif m is SecretStr:
            parts.append("secret")
        elif m is Path:
            parts.append("path")
        else:
            parts.append(getattr(m, "__name__", str(m)))
    text = " \\| ".join(parts)
    return f"{text} (optional)" if optional else text


def is_secret(name: str, annotation: Any) -> bool:
    return SecretStr in _union_members(annotation) or name.endswith(SECRET_NAMES)


def default_text(name: str, field: FieldInfo) -> str:
    """The default as an operator would write it; `(unset)` / `(secret)` for secrets, never a value;
    `(computed)` when it depends on the machine (the description says how)."""
    if field.default_factory is not None:
        if field.default_factory in (dict, list):
            return "`{}`" if field.default_factory is dict else "`[]`"
        return "(computed)"
    value = field.default
    if value is PydanticUndefined:
        return "(required)"
    if is_secret(name, field.annotation):
        empty = value is None or (value.get_secret_value() if isinstance(value, SecretStr) else value) == ""
        return "(unset)" if empty else "(secret)"
    if value is None:
        return "(unset)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        value = value.relative_to(ROOT) if value.is_relative_to(ROOT) else value
    if value == "":
        return '`""`'
    return f"`{value}`"


def unit_of(name: str, field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "unit" in extra:
        return str(extra["unit"])
    return next((unit for suffix, unit in UNIT_SUFFIXES if name.endswith(suffix)), "")


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def walk(cls: type[BaseModel], prefix: str, read_by: str) -> Iterator[Variable]:
    """Every variable of `cls` under `prefix`, nested groups joined by `__`, in declaration order. The
    fields of a choice of kind are merged by name; a field only some kinds have says which."""
    for name, field in cls.model_fields.items():
        if name == "common":
            continue
        env = f"{prefix}{name}".upper()
        groups = groups_of(field.annotation)
        if not groups:
            yield Variable(env, type_name(field.annotation), default_text(name, field), unit_of(name, field),
                           read_by, _one_line(field.description))
            continue
        yield from _walk_choice(groups, env + "__", read_by, _one_line(field.description))


def _walk_choice(groups: list[type[BaseModel]], prefix: str, read_by: str, about: str) -> Iterator[Variable]:
    kinds = {g: _kind_of(g) for g in groups}
    rows: dict[str, list[tuple[type[BaseModel], Variable]]] = {}
    for g in groups:
        for v in walk(g, prefix, read_by):
            rows.setdefault(v.name, []).append((g, v))
    for name, found in rows.items():
        first = found[0][1]
        if name.endswith("__KIND") and len(groups) > 1:
            choices = "; ".join(f"`{kinds[g]}` = {_one_line(g.__doc__).rstrip('.')}" for g in groups)
            defaults = [v.default for _, v in found if v.default != "(required)"]
            yield Variable(name, " \\| ".join(f"`{kinds[g]}`" for g in groups), defaults[0] if defaults else "",
                           "", read_by, f"{about} Kinds: {choices}.")
            continue
        if len(groups) == 1 or len(found) == len(groups) and len({v.description for _, v in found}) == 1:
            description = first.description if len(groups) > 1 or not name.endswith("__KIND") else about
            yield Variable(name, first.type, first.default, first.unit, read_by, description)
            continue
        by_text: dict[str, list[str]] = {}
        for g, v in found:
            by_text.setdefault(v.description, []).append(f"`{kinds[g]}`")
        description = " ".join(f"(kind {', '.join(ks)}) {text}" for text, ks in by_text.items())
        yield Variable(name, first.type, first.default, first.unit, read_by, description)


def _kind_of(group: type[BaseModel]) -> str:
    field = group.model_fields.get("kind")
    args = get_args(field.annotation) if field is not None else ()
    return str(args[0]) if args else group.__name__


def variables() -> dict[str, list[Variable]]:
    """Per source (`common`, then each service), its variables."""
    out = {}
    for source, module, name in SOURCES:
        cls = settings_class(module, name)
        read_by = "every service" if source == "common" else source
        out[source] = list(walk(cls, str(cls.model_config.get("env_prefix") or ""), read_by))
    return out


def env_names(service: str) -> set[str]:
    """Every variable `service` reads through its settings (CommonSettings' included)."""
    found = variables()
    return {v.name for v in found["common"] + found[service]}


HEADER = """# Settings reference

Generated from the settings classes by `make settings-doc` (`python -m tools.settings_reference`); do not
edit by hand: tests/unit/test_settings_reference.py fails when this file and the code differ. The classes
are shared/settings.py (`CommonSettings`, read by every service) and services/<name>/settings.py.

How to read it:
- Every setting is an environment variable. A service's own settings start with `APPRENTICE_<SERVICE>_`,
  the common ones with `APPRENTICE_`.
- Related settings are nested groups: `__` joins a group and its field (`APPRENTICE_EXTRACTOR_LLM__MODEL`).
  Where a group is a choice of kind, `..__KIND` picks it and the other fields of the group depend on the
  kind ("(kind `openai`)"); a field of another kind is refused at start, as is a misspelt field of a group.
- A variable of the old flat layout that moved into a group (`APPRENTICE_EXTRACTOR_OPENAI_MODEL`) stops the
  start with a message naming its new name.
- Lists take a comma-separated value or a JSON list; JSON objects are JSON (`{"acme": 512}`).
- Secrets never show a value here: `(unset)` or `(secret)`. `(computed)`: the description says from what.
"""


def render(found: dict[str, list[Variable]]) -> str:
    lines = [HEADER]
    for source, rows in found.items():
        prefix = "APPRENTICE_" if source == "common" else f"APPRENTICE_{source.upper()}_"
        title = "Common settings (every service)" if source == "common" else f"{source} (services/{source}/settings.py)"
        lines += [f"## {title}", "", f"{len(rows)} variables, `{prefix}*`, read by {rows[0].read_by}.", "",
                  "| Variable | Type | Default | Unit | Read by | Description |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{v.name}` | {v.type} | {v.default} | {v.unit} | {v.read_by} | {v.description} |" for v in rows]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.settings_reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/settings.md is not up to date")
    args = parser.parse_args(argv)
    text = render(variables())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run `make settings-doc`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {sum(len(r) for r in variables().values())} variables")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
