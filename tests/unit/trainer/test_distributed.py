"""The torchrun path: two gloo ranks on CPU, each training its shard, end with exactly the weights of one
process training the whole batch (RL update and distillation step)."""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from services.trainer.distill import (
    DistillConfig,
    DistillExample,
    consolidation_round,
    context_from_items,
    distill_step,
)
from services.trainer.policy import Policy, PolicyConfig
from services.trainer.rl import RLConfig, RunningBaseline, rl_round
from services.trainer.rollouts import Rollout


def rollouts() -> list[Rollout]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(10):
        n = int(torch.randint(2, 7, (1,), generator=g))
        out.append(Rollout(str(i), [11, 12, 13 + i % 3], torch.randint(100, 4000, (n,), generator=g).tolist(),
                           reward=float(i % 3 == 0), group_id=f"g{i // 5}", group_size=5))
    return out


def train(model: torch.nn.Module, tok: object) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    p = Policy(PolicyConfig("tiny-random", lr=1e-2), model=copy.deepcopy(model), tokenizer=tok)
    m = rl_round(p, rollouts(), RLConfig(batch_size=10, micro_batch_size=2), RunningBaseline())
    teacher = p.snapshot()
    rs = rollouts()
    *_, distill_norm = distill_step(p, teacher, [r.prompt_ids for r in rs], [[5, 6, *r.prompt_ids] for r in rs],
                 [r.completion_ids for r in rs], [i % 4 == 0 for i in range(len(rs))],
                 DistillConfig(method="gkd", topk=64, micro_batch_size=2))
    # a whole consolidation round: rank 0 samples, the sequences are broadcast, each rank trains a shard
    examples = [DistillExample([{"role": "user", "content": q}]) for q in ("warranty?", "returns?", "hours?")]
    c = consolidation_round(p, p.snapshot(), examples, context_from_items(["Warranty: 14 months."]),
                            DistillConfig(batch=3, steps=2, max_new_tokens=4, micro_batch_size=1, topk=64))
    out = {n: t.detach().clone() for n, t in p.model.named_parameters() if t.requires_grad}
    # pre-clip gradient norms after the all-reduce: they expose a scale error (mean instead of sum) that
    # Adam's scale-invariant update would hide in the weights
    out["grad_norms"] = torch.tensor([m["grad_norm"], distill_norm, c["grad_norm"]], dtype=torch.float64)
    return out


def _worker(rank: int, port: int, out: str) -> None:
    from shared.models import load_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model, tok = load_model("tiny-random")
        torch.save(train(model, tok), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_two_ranks_equal_one_process(tiny_model_name: str, tmp_path: Path) -> None:
    from shared.models import load_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    model, tok = load_model(tiny_model_name)
    single = train(model, tok)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert single.keys() == r0.keys() == r1.keys()
    assert torch.allclose(r0.pop("grad_norms"), single.pop("grad_norms"), rtol=1e-4)
    r1.pop("grad_norms")
    moved = False
    for name, w in single.items():
        assert torch.equal(r0[name], r1[name]), f"ranks diverged on {name}"
        # float summation order differs (shards vs whole batch); Adam (lr 1e-2, 5 steps, updates ~1e-2 per
        # element) amplifies that to ~1e-4 at most, while a lost or doubled shard would differ by ~1e-2
        assert torch.allclose(r0[name], w, atol=5e-4), f"{name}: 2 ranks != 1 process, max diff {(r0[name] - w).abs().max():.2e}"
        moved |= bool(w.abs().sum() > 0) and "lora_B" in name
    assert moved, "the updates must have changed the adapter"
