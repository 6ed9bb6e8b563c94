"""Single process or torchrun: rank, world size, sharding and the gradient all-reduce.

Scale-out design (data parallel): every rank holds the same policy (same seed, same checkpoint) and
receives the same round (rank 0 reads Kafka and broadcasts it). Advantages are computed on the whole
round on every rank; each optimizer batch is sharded `batch[rank::world]`; losses are normalised by the
batch-wide counts (sequences / tokens), so summing the ranks' gradients (one all-reduce per optimizer
step, `Policy.step`) gives exactly the single-process gradient, and the identical updates keep the
ranks in sync. A manual all-reduce instead of DDP's hooks tolerates ranks with different numbers of
micro-batches. Only rank 0 writes checkpoints, uploads and announces.

With WORLD_SIZE unset (or 1) everything here is a no-op and the trainer is a plain process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def init_from_env() -> bool:
    """Join the torchrun process group when launched by torchrun (WORLD_SIZE > 1). Returns True if
    distributed. NCCL on CUDA (each rank on cuda:LOCAL_RANK), gloo on CPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return True


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of a batch (round-robin, so lengths differ by at most one)."""
    return list(items[rank()::world_size()])


def all_reduce_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks in one flat buffer (missing grads count as zeros)."""
    if world_size() <= 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).clone()
        offset += n


def broadcast(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s object on every rank (rounds travel from the Kafka-reading rank 0 to the others)."""
    if world_size() <= 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
