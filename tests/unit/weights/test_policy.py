"""PromotionPolicy: approved checkpoints follow the policy once; older ones never replace newer ones."""

from __future__ import annotations

from services.weights.orders import OrderDesk
from services.weights.policy import PromotionPolicy
from services.weights.settings import LocalStoreSettings, WeightsSettings
from services.weights.store import WeightStore
from shared.contracts.events import make_envelope
from shared.proto.apprentice.v1 import events_pb2, weights_pb2

from .conftest import UploadFn
from .test_orders import Recorder, approve


def event(version: str, event_id: str | None = None) -> events_pb2.CheckpointPublished:
    return events_pb2.CheckpointPublished(envelope=make_envelope("default", source="t", event_id=event_id),
                                          model="m", version=version)


def policy(store: WeightStore, name: str) -> tuple[PromotionPolicy, Recorder]:
    rec = Recorder()
    settings = WeightsSettings(store=LocalStoreSettings(dir=store.root), policy=name)  # type: ignore[arg-type]
    return PromotionPolicy(store, OrderDesk(store, rec), None, settings), rec


def test_auto_promotes_once_per_event(store: WeightStore, upload: UploadFn) -> None:
    p, rec = policy(store, "auto")
    upload({"w": b"1"})
    approve(store, "v1")
    ev = event("v1", event_id="e-1")
    assert p.on_checkpoint(ev) == "promoted"
    assert p.on_checkpoint(ev) == "duplicate event"  # redelivered: no second order
    assert [u.version for u in rec.sent] == ["v1"]


def test_older_candidate_is_not_auto_promoted(store: WeightStore, upload: UploadFn) -> None:
    p, rec = policy(store, "auto")
    upload({"w": b"1"})
    upload({"w": b"2"})
    approve(store, "v1")
    approve(store, "v2")
    assert p.on_checkpoint(event("v2")) == "promoted"
    assert "newer and already served" in p.on_checkpoint(event("v1"))
    assert [u.version for u in rec.sent] == ["v2"]


def test_manual_and_canary_policies(store: WeightStore, upload: UploadFn) -> None:
    upload({"w": b"1"})
    approve(store, "v1")
    p, rec = policy(store, "manual")
    assert "waiting for an operator" in p.on_checkpoint(event("v1"))
    assert rec.sent == []
    p, rec = policy(store, "canary")
    assert p.on_checkpoint(event("v1")) == "canary at 10%"
    assert rec.sent[0].action == events_pb2.UPDATE_ACTION_CANARY and rec.sent[0].canary_fraction == 0.1


def test_rejected_candidate_gets_no_order(store: WeightStore, upload: UploadFn) -> None:
    p, rec = policy(store, "auto")
    upload({"w": b"1"})
    store.update("m", "v1", lambda m: setattr(m, "status", weights_pb2.VERSION_STATUS_REJECTED))
    assert p.on_checkpoint(event("v1")) == "recorded" and rec.sent == []
