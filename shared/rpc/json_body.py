"""Parsing a JSON request body that arrived from outside (the OpenAI-compatible API, the dashboard's actions).

`json.loads` accepts two inputs that later break the handler with an internal error: a deeply nested body
(`[[[[...]]]]` 100k deep raises RecursionError, which is no ValueError) and a lone UTF-16 surrogate escape
(`"\\ud800"` parses into a str that cannot be encoded as UTF-8, so the first encode - a log line, a protobuf
field, a Kafka record - raises UnicodeEncodeError). Both are the client's mistake and must be refused as one,
with a message and without an exception name. This module is the one place that does it for every HTTP route.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of arrays/objects accepted; no request schema of the project nests more than a few levels."""


class InvalidJSONBody(ValueError):
    """The body is not JSON the services accept; the message is safe to return to the client."""


def _depth_exceeds(data: bytes | str, limit: int) -> bool:
    """True when brackets nest deeper than `limit` outside strings: checked before parsing, without recursion."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes | bytearray) else data
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _check_encodable(value: Any) -> None:
    """Every string (keys included) must be valid Unicode text: a lone surrogate is refused here."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidJSONBody("the body holds a string with a lone UTF-16 surrogate "
                                      "(an unpaired \\ud800-\\udfff escape), which is not text") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse_json_body(data: bytes | bytearray | str, max_depth: int = MAX_DEPTH) -> Any:
    """The parsed body, or InvalidJSONBody with a client-safe message (too deep, not JSON, not text)."""
    if _depth_exceeds(bytes(data) if isinstance(data, bytearray) else data, max_depth):
        raise InvalidJSONBody(f"the body nests arrays/objects deeper than {max_depth} levels")
    try:
        value = json.loads(data)
    except RecursionError:
        raise InvalidJSONBody(f"the body nests arrays/objects deeper than {max_depth} levels") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError (bytes that are not UTF-8)
        raise InvalidJSONBody(f"the body is not valid JSON: {e}") from None
    _check_encodable(value)
    return value
