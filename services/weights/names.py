"""Names from callers (model, version, file path, tenant, pod id) --> accepted, or INVALID_ARGUMENT with the rule.

Model and version names become directory and file names under the store root, file paths name entries in
a manifest that pods lay out on their disks, tenants key the promotion state. Each is checked against one
written rule before anything touches the disk, and the refusal quotes the rule so a caller can fix it.

| name | rule |
|---|---|
| model | 1-200 characters; segments separated by single `/` (hub ids such as `org/name`, or an absolute local path such as `/models/llama`); each segment starts with a letter or digit and holds letters, digits, `.`, `_`, `-` (so no empty, `.` or `..` segment) |
| version | 1-64 characters: letters, digits, `.`, `_`, `-`, starting with a letter or digit (`base` is reserved) |
| file path | 1-255 characters; at most 16 segments separated by single `/`; each segment of letters, digits, `.`, `_`, `-`, `+`, neither `.` nor `..` (no leading, trailing or doubled `/`) |
| tenant, pod id | 1-128 characters: letters, digits, `.`, `_`, `-`, starting with a letter or digit ("" = the operator slot, for tenants) |

Backslashes, NUL and control characters fail every rule (they are outside each character set). A local
directory used as APPRENTICE_MODEL (`/models/llama`) is a valid model name: the store percent-quotes the
whole name into one directory name.
"""

from __future__ import annotations

import re

from services.weights.manifests import VERSION_RE
from shared.rpc.grpc_util import require

MAX_MODEL_CHARS = 200
MAX_PATH_CHARS = 255
MAX_PATH_SEGMENTS = 16

_MODEL_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._+-]+")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Tenants and pod ids (the same rule the inference service applies to tenants and pod ids)."""

MODEL_RULE = (f"1-{MAX_MODEL_CHARS} characters, segments separated by single '/' (an absolute local path may "
              "start with '/'), each starting with a letter or digit and made of letters, digits, '.', '_', '-'")
VERSION_RULE = "1-64 characters of letters, digits, '.', '_', '-', starting with a letter or digit"
PATH_RULE = (f"relative, 1-{MAX_PATH_CHARS} characters in at most {MAX_PATH_SEGMENTS} segments separated by "
             "single '/', each made of letters, digits, '.', '_', '-', '+' and neither '.' nor '..'")
NAME_RULE = "1-128 characters of letters, digits, '.', '_', '-', starting with a letter or digit"


def _shown(value: str) -> str:
    return repr(value[:60] + ("..." if len(value) > 60 else ""))


def validate_model(model: str) -> None:
    """A hub id (`org/name`) or an absolute local path (`/models/llama`, what APPRENTICE_MODEL may name):
    the store keeps a model under one percent-quoted directory name, so only `.`, `..` and empty
    segments could ever name another directory, and those are refused."""
    require(bool(model), "model must not be empty")
    relative = model[1:] if model.startswith("/") else model
    require(len(model) <= MAX_MODEL_CHARS and all(_MODEL_SEGMENT.fullmatch(s) for s in relative.split("/")),
            f"model name {_shown(model)} is not allowed: use {MODEL_RULE}")


def validate_version(version: str, what: str = "version") -> None:
    require(VERSION_RE.fullmatch(version) is not None,
            f"{what} {_shown(version)} must match {VERSION_RE.pattern} ({VERSION_RULE})")


def validate_path(path: str) -> None:
    """A file path inside a version: split on '/' literally, so `./x`, `a//b` and `a/` are refused rather
    than normalised (a normalised path would name a different file than the one the caller declared)."""
    require(bool(path), "file path must not be empty")
    parts = path.split("/")
    require(len(path) <= MAX_PATH_CHARS and len(parts) <= MAX_PATH_SEGMENTS
            and all(_PATH_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts),
            f"file path {_shown(path)} must be {PATH_RULE}")


def validate_tenant(tenant: str, what: str = "tenant") -> None:
    """A tenant name; "" is the operator slot and always valid."""
    require(tenant == "" or NAME_RE.fullmatch(tenant) is not None,
            f"{what} {_shown(tenant)} is not allowed: use {NAME_RULE} (or \"\" for the operator slot)")


def validate_pod_id(pod_id: str) -> None:
    require(bool(pod_id), "pod_id is required")
    require(NAME_RE.fullmatch(pod_id) is not None, f"pod_id {_shown(pod_id)} is not allowed: use {NAME_RULE}")
