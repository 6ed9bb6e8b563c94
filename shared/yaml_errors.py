"""A YAML file that does not parse or does not fit its schema --> `file:line:column: what is wrong`.

A person fixing a hand-written file (a task, a grader config) needs the place, not a Python traceback nor
pydantic's location tuple: the YAML node tree knows where every key and value starts, so a validation
error's `loc` (`facts -> 2 -> questions`) is walked down that tree to its line and column. One line per
file: several errors are joined with "; ".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def syntax_error(path: Path | str, e: yaml.YAMLError) -> str:
    """`path:line:col: YAML syntax error: problem (context)` for a file that does not parse."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or " ".join(str(e).split())
    context = getattr(e, "context", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where}: YAML syntax error: {problem}" + (f" ({context})" if context else "")


def _node_at(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The deepest node of `root` along `loc` (a missing key stops at its parent mapping)."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            value = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if value is None:
                return node
            node = value
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def validation_error(path: Path | str, text: str, e: ValidationError) -> str:
    """`path:line:col: field.path: message` for each schema error, on one line."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        root = None
    parts = []
    for err in e.errors():
        loc = tuple(err.get("loc", ()))
        node = _node_at(root, loc)
        where = f"{path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}" if node is not None else str(path)
        field = ".".join(str(p) for p in loc) or "(top level)"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {field}: {msg}")
    return "; ".join(parts)
