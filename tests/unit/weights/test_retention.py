"""Retention keeps the newest N, pinned, served, canaried, rollback target and LoRA bases; GC frees the rest."""

from __future__ import annotations

from services.weights.manifests import ModelState
from services.weights.retention import versions_to_keep
from services.weights.store import WeightStore
from shared.contracts.orders import Slot
from shared.proto.apprentice.v1 import weights_pb2

from .conftest import UploadFn


def m(version: str, t: int, **kw: object) -> weights_pb2.Manifest:
    kw.setdefault("kind", "full")
    out = weights_pb2.Manifest(model="m", version=version, **kw)  # type: ignore[arg-type]
    out.created_at.seconds = t
    return out


def test_keep_rules() -> None:
    ms = [m("v1", 1), m("v2", 2, pinned=True), m("v3", 3), m("v4", 4), m("v5", 5), m("v6", 6),
          m("v7", 7, kind="lora", base_version="v3"), m("v8", 8), m("v9", 9)]
    state = ModelState(model="m", slots={"": Slot(promoted="v4", history=("base", "v1", "v5")),
                                         "acme": Slot(promoted="", canary="v7")})
    keep = versions_to_keep(ms, state, keep_last=2)
    # newest 2: v8 v9; pinned v2; served v4; canary v7 (+ its base v3); rollback target v5
    assert keep == {"v2", "v3", "v4", "v5", "v7", "v8", "v9"}


def test_gc_deletes_versions_and_unreferenced_blobs(store: WeightStore, upload: UploadFn) -> None:
    shared_cfg = b"{config}"
    for i in range(5):
        upload({"config.json": shared_cfg, "w": f"weights {i}".encode()})
    store.update("m", "v1", lambda x: setattr(x, "pinned", True))
    state = store.state("m")
    state.slots[""] = Slot(promoted="v2")
    store.save_state(state)
    blobs_before = set(store.blobs.list())
    report = store.collect(keep_last=2)
    assert sorted(report.deleted_versions) == ["m/v3"]
    assert [x.version for x in store.list("m")] == ["v1", "v2", "v4", "v5"]
    assert report.deleted_blobs == 1 and report.freed_bytes == len(b"weights 2")
    assert len(set(store.blobs.list())) == len(blobs_before) - 1
    for v in store.list("m"):  # every kept version still has all its bytes
        assert all(store.blobs.exists(f.sha256) for f in v.files)
    assert store.collect(keep_last=2).deleted_blobs == 0  # nothing left to collect
