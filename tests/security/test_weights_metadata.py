"""Free-form upload metadata is bounded, and listing survives old oversized manifests (issue #33 item 3).

The attack, from an outside report: an upload carrying a 30 MB `training_metadata` value was stored, and
from then on `apprentice weights list` failed with RESOURCE_EXHAUSTED (the manifest rides whole in every
List answer), for operators and for the trainer's own idempotency check (services/trainer/publish.py).
Replayed against the real Weights server, secured as deployed, with the real broker. Now the upload is
refused with INVALID_ARGUMENT naming the 64 KiB bound (services/weights/metadata.py), and a manifest stored
before the bound still lists, trimmed, with a note of what was left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.weights import cli
from services.weights.metadata import MAX_METADATA_BYTES, TRUNCATED_KEY
from services.weights.service import RunningServer
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import common_pb2, weights_pb2, weights_pb2_grpc
from tests.helpers.weights import start_weights
from tests.security.harness import Dialer, rpc_error
from tools.devca import DevCredentials

pytestmark = pytest.mark.integration
MODEL = "tiny-random"
W = weights_pb2
HUGE = "x" * (30 << 20)
"""The reported 30 MB value."""


@pytest.fixture
def server(topics: Topics, secure_env: DevCredentials, tmp_path: Path) -> Iterator[RunningServer]:
    running = start_weights(tmp_path / "store")
    yield running
    running.stop(grace=1.0)


@pytest.fixture
def stub(server: RunningServer, dial: Dialer) -> weights_pb2_grpc.WeightsStub:
    return weights_pb2_grpc.WeightsStub(dial.service(f"127.0.0.1:{server.port}"))


def _upload(stub: weights_pb2_grpc.WeightsStub, **kw: Any) -> W.Manifest:
    data = b"not a model, only bytes"
    h = W.UploadHeader(model=MODEL, kind="full", files=[W.FileEntry(path="model.safetensors", size=len(data),
                                                                    sha256=hashlib.sha256(data).hexdigest())], **kw)
    reqs = [W.UploadRequest(header=h), W.UploadRequest(chunk=W.FileChunk(path="model.safetensors", data=data))]
    return stub.Upload(iter(reqs), timeout=60)


@pytest.mark.parametrize(("fields", "message"), [
    ({"training_metadata": {"notes": HUGE}}, "more than the limit of 65536 bytes"),
    ({"training_metadata": {"notes": "y" * (MAX_METADATA_BYTES + 1)}}, "more than the limit of 65536 bytes"),
    ({"training_metadata": {f"k{i}": "v" for i in range(300)}}, "training_metadata has 300 entries"),
    ({"training_metadata": {"k" * 200: "v"}}, "training_metadata key"),
    ({"training_metadata": {"bad\nkey": "v"}}, "training_metadata key"),
    ({"train_metrics": {f"m{i}": 1.0 for i in range(300)}}, "train_metrics has 300 entries"),
    ({"data_offsets": [common_pb2.TopicOffsets(topic="t")] * 1100}, "data_offsets has 1100 entries"),
    ({"algorithm": "g" * 100}, "algorithm"),
    ({"base_model": "b" * (70 << 10)}, "more than the limit of 65536 bytes"),
])
def test_oversized_metadata_is_refused_at_upload(stub: weights_pb2_grpc.WeightsStub, server: RunningServer,
                                                 fields: dict[str, Any], message: str) -> None:
    e = rpc_error(lambda: _upload(stub, **fields))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (e.details() or ""), e.details()
    assert server.service.store.list(MODEL) == []
    ok = _upload(stub, training_metadata={"checkpoint_id": "c1", "notes": "z" * (60 << 10)})  # under the bound
    assert ok.training_metadata["checkpoint_id"] == "c1"


def test_list_works_over_an_old_oversized_manifest(stub: weights_pb2_grpc.WeightsStub, server: RunningServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest stored before the bound (written here straight into the store, as the old server did)."""
    good = _upload(stub, training_metadata={"checkpoint_id": "c-good"})
    old = _upload(stub, training_metadata={"checkpoint_id": "c-old"})
    store = server.service.store
    big = store.get(MODEL, old.version)
    big.training_metadata["notes"] = HUGE
    store.manifests.save(big)

    listed = {m.version: m for m in stub.List(W.ListVersionsRequest(model=MODEL), timeout=30).versions}
    assert listed[good.version].training_metadata["checkpoint_id"] == "c-good"
    trimmed = listed[old.version].training_metadata
    assert trimmed["checkpoint_id"] == "c-old" and "notes" not in trimmed   # the trainer's lookup still works
    assert "notes" in trimmed[TRUNCATED_KEY]
    got = stub.Get(W.GetVersionRequest(model=MODEL, version=old.version), timeout=30)
    assert got.ByteSize() < 2 * MAX_METADATA_BYTES and TRUNCATED_KEY in got.training_metadata

    endpoint = ["--endpoint", f"127.0.0.1:{server.port}", "--model", MODEL]
    assert cli.main(["list", *endpoint]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert old.version in out and good.version in out
    assert cli.main(["list", "--json", *endpoint]) == 0, capsys.readouterr().err
    assert cli.main(["get", old.version, *endpoint]) == 0, capsys.readouterr().err
    assert len(capsys.readouterr().out) < 4 * MAX_METADATA_BYTES
