"""Name rules: what callers may call models, versions, files, tenants and pods (each refusal quotes the rule)."""

from __future__ import annotations

from typing import Any

import pytest

from services.weights.names import (
    validate_model,
    validate_path,
    validate_pod_id,
    validate_tenant,
    validate_version,
)
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import weights_pb2
from shared.rpc.grpc_util import InvalidRequest

from .conftest import entry


@pytest.mark.parametrize("name", ["tiny-random", "smollm2-135m-instruct", "Qwen/Qwen3-0.6B", "org/sub/m_1.2",
                                  "/models/llama-3"])  # a local path as APPRENTICE_MODEL
def test_model_names_accepted(name: str) -> None:
    validate_model(name)


@pytest.mark.parametrize("name", ["..", ".", "a/../b", "/..", "/", "//abs", "/abs/../x", "a//b", "a/", "./x", ".hidden", "a\\b",
                                  "a\x00b", "tab\tname", "new\nline", "-rf", "a b", "m" * 201, "é"])
def test_model_names_refused(name: str) -> None:
    with pytest.raises(InvalidRequest, match="is not allowed: use 1-200 characters"):
        validate_model(name)


def test_empty_model() -> None:
    with pytest.raises(InvalidRequest, match="model must not be empty"):
        validate_model("")


@pytest.mark.parametrize("path", ["model.safetensors", "sub/weights.bin", "model-00001-of-00002.safetensors",
                                  ".gitattributes", "a+b/c_d.json"])
def test_paths_accepted(path: str) -> None:
    validate_path(path)


@pytest.mark.parametrize("path", ["./x", "a//b", "a/", "/abs", "..", "../etc/passwd", "a/./b", "a/../b", "a\\b",
                                  "a\x00b", "a\nb", "a b", "x" * 256, "/".join(["d"] * 17)])
def test_paths_refused_not_normalised(path: str) -> None:
    with pytest.raises(InvalidRequest, match="must be relative, 1-255 characters"):
        validate_path(path)


@pytest.mark.parametrize("version", ["..", ".", "v1\n", "", "-v", "a/b", "v" * 65])
def test_versions_refused(version: str) -> None:
    with pytest.raises(InvalidRequest, match="must match"):
        validate_version(version)


def test_tenants_and_pods() -> None:
    validate_tenant("")  # the operator slot
    validate_tenant("acme.eu-1")
    validate_pod_id("inference-0")
    for bad in ("..", "a/b", " x", "x" * 129):
        with pytest.raises(InvalidRequest, match="1-128 characters"):
            validate_tenant(bad)
        with pytest.raises(InvalidRequest, match="1-128 characters"):
            validate_pod_id(bad)
    with pytest.raises(InvalidRequest, match="pod_id is required"):
        validate_pod_id("")


@pytest.mark.parametrize(("fields", "message"), [
    ({"model": ".."}, "model name '..' is not allowed"),
    ({"tenant": "../x"}, "tenant '../x' is not allowed"),
    ({"parent_version": ".."}, "parent_version '..' must match"),
    ({"files": [entry("./x", b"1")]}, "file path './x' must be relative"),
    ({"files": [entry("a//b", b"1")]}, "file path 'a//b' must be relative"),
])
def test_upload_headers_use_the_rules(store: WeightStore, fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"model": "m", "kind": "full", "files": [entry("a", b"1")]}
    base.update(fields)
    with pytest.raises(InvalidRequest, match=message):
        store.begin_upload(weights_pb2.UploadHeader(**base))
