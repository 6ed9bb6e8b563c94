"""Stored versions + promotion state --> which versions to keep and which blobs nothing references.

Kept, per model:
1. the newest `keep_last` versions (creation order);
2. every pinned version;
3. whatever a tenant slot serves or canaries now, and each slot's most recent previous promotion (the
   target of a plain `rollback`);
4. the configured eval-gate references (`reference_version`, `tenant_reference_versions`): the cumulative
   drift limits compare every candidate with them;
5. the full version a kept LoRA adapter applies to (`base_version`), transitively.
Everything else is deleted; then every blob that no remaining manifest (of any model) names is deleted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from services.weights.manifests import ModelState, version_order_key
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import weights_pb2

LIVE_STATUSES = (weights_pb2.VERSION_STATUS_PROMOTED, weights_pb2.VERSION_STATUS_CANARY)


def versions_to_keep(manifests: list[weights_pb2.Manifest], state: ModelState, keep_last: int,
                     also_keep: Collection[str] = ()) -> set[str]:
    by_name = {m.version: m for m in manifests}
    ordered = sorted(manifests, key=version_order_key)
    keep = {m.version for m in ordered[-keep_last:]} if keep_last > 0 else set()  # 1
    keep |= {m.version for m in manifests if m.pinned or m.status in LIVE_STATUSES}  # 2
    for slot in state.slots.values():  # 3
        keep |= {v for v in (slot.promoted, slot.canary) if v}
        previous = [v for v in slot.history if v in by_name]
        if previous:
            keep.add(previous[-1])
    keep |= set(also_keep)  # 4
    frontier = list(keep)  # 5
    while frontier:
        m = by_name.get(frontier.pop())
        if m is not None and m.kind == "lora" and m.base_version and m.base_version not in keep:
            keep.add(m.base_version)
            frontier.append(m.base_version)
    keep.discard(BASE)
    return keep & set(by_name)


def referenced_blobs(manifests: Iterable[weights_pb2.Manifest]) -> set[str]:
    return {f.sha256 for m in manifests for f in m.files}


def unreferenced(all_blobs: Iterable[str], kept_manifests: Iterable[weights_pb2.Manifest]) -> set[str]:
    return set(all_blobs) - referenced_blobs(kept_manifests)
