"""One meaning of an order (shared/contracts/orders.py): after each operator action, the routing table an inference
pod builds from the published orders holds the slots the weights desk saved."""

from __future__ import annotations

from collections.abc import Callable

from services.inference.routing import RoutingTable
from services.weights.orders import OrderDesk
from services.weights.store import WeightStore
from shared.contracts.orders import Slot
from shared.proto.apprentice.v1 import events_pb2

from .conftest import UploadFn
from .test_orders import approve


def _view(slots: dict[str, Slot]) -> dict[str, tuple[str, str, float, tuple[str, ...]]]:
    return {t: (s.promoted, s.canary, s.canary_fraction, tuple(s.history)) for t, s in slots.items() if not s.empty}


def test_a_pod_applying_the_desks_orders_holds_the_desks_slots(store: WeightStore, upload: UploadFn) -> None:
    sent: list[events_pb2.ModelUpdate] = []
    desk = OrderDesk(store, sent.append)
    for i in range(5):                                       # v1..v3 the operator's, v4 and v5 acme's
        upload({"w": f"w{i}".encode()}, **({"tenant": "acme"} if i >= 3 else {}))
        approve(store, f"v{i + 1}")
    steps: list[Callable[[], object]] = [
        lambda: desk.promote("m", "v1"), lambda: desk.promote("m", "v2"), lambda: desk.canary("m", "v3", 0.3),
        lambda: desk.promote("m", "v3"), lambda: desk.rollback("m"), lambda: desk.rollback("m", "v1"),
        lambda: desk.promote("m", "v4"), lambda: desk.canary("m", "v5", 0.5), lambda: desk.rollback("m", tenant="acme"),
        lambda: desk.promote("m", "v5", force=True), lambda: desk.rollback("m", "base", tenant=""),
    ]
    table = RoutingTable()
    for i, step in enumerate(steps):
        step()
        for order in sent:
            table = table.apply(order)
        sent.clear()
        assert _view(table.slots) == _view(store.state("m").slots), i
