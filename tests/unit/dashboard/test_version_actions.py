"""The versions page offers exactly the weights orders the weights service accepts: every version of a real
store (served, canary, retired, rolled back, rejected, approved, candidate, a tenant's own) in a real promotion
state, each order tried on the real OrderDesk (in a fresh copy of that state), against what
`versions_view` offers for it and, for what it does not offer, that it says why. One accepted order is
not offered: promoting the version its slot serves already (a no-op order)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from services.dashboard.views import WEIGHTS_ACTIONS, versions_view
from services.weights.blob_backends import make_blob_store
from services.weights.orders import OrderDesk
from services.weights.pods import PodRegistry
from services.weights.store import WeightStore
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from shared.rpc.grpc_util import FailedPrecondition

S = weights_pb2


def _store(root: Path) -> WeightStore:
    return WeightStore(make_blob_store("local", root), root)


def _upload(store: WeightStore, data: bytes, **fields: object) -> weights_pb2.Manifest:
    entry = S.FileEntry(path="w", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    header = S.UploadHeader(model="m", kind="full", files=[entry], **fields)  # type: ignore[arg-type]
    session = store.begin_upload(header)
    session.add(S.FileChunk(path="w", offset=0, data=data))
    return session.finish()


def _set_status(store: WeightStore, version: str, status: weights_pb2.VersionStatus) -> None:
    store.update("m", version, lambda m: setattr(m, "status", status))


def _approve(m: weights_pb2.Manifest) -> weights_pb2.Manifest:
    """The eval gate, passing everything (the real service always has one: a candidate is evaluated first)."""
    out = weights_pb2.Manifest()
    out.CopyFrom(m)
    out.status = S.VERSION_STATUS_APPROVED
    return out


def _desk(store: WeightStore) -> OrderDesk:
    sent: list[events_pb2.ModelUpdate] = []
    return OrderDesk(store, sent.append, source="test", gate=lambda m: (
        store.update(m.model, m.version, lambda x: setattr(x, "status", S.VERSION_STATUS_APPROVED)),
        _approve(m))[1])


def busy(store: WeightStore) -> None:
    """v1 retired, v2 served to every tenant with v3 on canary, v4 rejected, v5 rolled back, v6 approved,
    v7 a candidate; tenant shop's own v8 served to shop only, its v9 approved."""
    desk = _desk(store)
    for i in range(1, 8):
        _upload(store, f"w{i}".encode())
    for v in ("v1", "v2", "v3", "v5", "v6"):
        _set_status(store, v, S.VERSION_STATUS_APPROVED)
    desk.promote("m", "v1")
    desk.promote("m", "v2")
    desk.promote("m", "v5")
    desk.rollback("m")                                  # v5 rolled back, v2 served again
    desk.canary("m", "v3", 0.1)
    _set_status(store, "v4", S.VERSION_STATUS_REJECTED)
    for i in (8, 9):
        _upload(store, f"w{i}".encode(), tenant="shop")
        _set_status(store, f"v{i}", S.VERSION_STATUS_APPROVED)
    desk.promote("m", "v8")


def quiet(store: WeightStore) -> None:
    """v1 served, no canary anywhere; v2 approved."""
    desk = _desk(store)
    for i in (1, 2):
        _upload(store, f"w{i}".encode())
        _set_status(store, f"v{i}", S.VERSION_STATUS_APPROVED)
    desk.promote("m", "v1")


def _accepted(store: WeightStore, action: str, version: str) -> bool:
    desk = _desk(store)
    try:
        if action == "promote":
            desk.promote("m", version)
        elif action == "canary":
            desk.canary("m", version, 0.2)
        else:
            desk.rollback("m", version)
    except FailedPrecondition:
        return False
    return True


@pytest.mark.parametrize("scenario", [busy, quiet])
def test_offered_orders_are_the_accepted_ones(tmp_path: Path, scenario: Callable[[WeightStore], None]) -> None:
    shown = _store(tmp_path / "shown")
    scenario(shown)
    status = PodRegistry().status(shown.state("m"), order_deadline_s=30, heartbeat_timeout_s=30, forget_s=600)
    view = versions_view(shown.list("m"), status)
    assert view["versions"]
    n = 0
    for row in view["versions"]:
        for action in WEIGHTS_ACTIONS:
            n += 1
            tried = _store(tmp_path / f"try-{n}")
            scenario(tried)
            accepted = _accepted(tried, action, row["version"])
            # one accepted order is not offered: promoting what its slot serves already (it changes nothing)
            noop = action == "promote" and row["serving"]
            assert (action in row["actions"]) == (accepted and not noop), (row["version"], action, row["status"], accepted)
            assert action in row["actions"] or row["not_offered"][action], (row["version"], action)
