"""Atomic checkpoints: weights + optimizer + state round trip; interrupted writes are invisible."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from services.trainer.checkpoint import CheckpointStore
from services.trainer.policy import Policy, PolicyConfig
from services.trainer.rl import RLConfig, RunningBaseline, rl_round
from services.trainer.rollouts import Rollout


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str):  # noqa: ANN201
    from shared.models import load_model

    return load_model(tiny_model_name)


def trained_policy(tiny, finetune: str) -> Policy:  # noqa: ANN001
    model, tok = tiny
    p = Policy(PolicyConfig("tiny-random", finetune=finetune, lr=1e-3), model=copy.deepcopy(model), tokenizer=tok)
    rs = [Rollout(str(i), [1, 2, 3], [4 + i, 5], reward=float(i % 2), group_id="g", group_size=4) for i in range(4)]
    rl_round(p, rs, RLConfig(batch_size=4), RunningBaseline())
    return p


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_round_trip_restores_weights_optimizer_and_state(tiny, tmp_path: Path, finetune: str) -> None:  # noqa: ANN001
    p = trained_policy(tiny, finetune)
    store = CheckpointStore(tmp_path)
    ck = store.write(p, {"offsets": {"graded": {"0": 12}}, "trained_ids": ["0", "1"]})
    latest = store.latest()
    assert latest is not None and latest.id == ck.id and ck.state["seq"] == 1 and ck.state["kind"] == finetune
    files = {f.name for f in ck.weights_dir.iterdir()}
    assert ("adapter_model.safetensors" if finetune == "lora" else "model.safetensors") in files
    q = Policy(PolicyConfig("tiny-random", finetune=finetune, lr=1e-3), init_dir=ck.weights_dir,
               tokenizer=tiny[1], model=None if finetune == "full" else copy.deepcopy(tiny[0]))
    q.load_training_state(ck.training_state)
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(p.model(input_ids=x).logits, q.model(input_ids=x).logits, atol=1e-5)
    assert q.steps == p.steps == 1
    sa, sb = p.optimizer.state_dict()["state"], q.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.allclose(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    assert json.loads((ck.path / "state.json").read_text())["offsets"] == {"graded": {"0": 12}}


def test_interrupted_write_is_invisible_and_cleaned(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    p = trained_policy(tiny, "lora")
    store = CheckpointStore(tmp_path)
    first = store.write(p, {"n": 1})
    # a crash mid-write leaves a hidden temp folder and an un-renamed LATEST temp file
    (store.dir / ".tmp-ckpt-000002-dead").mkdir()
    (store.dir / ".tmp-ckpt-000002-dead" / "state.json").write_text("{broken")
    again = CheckpointStore(tmp_path)
    latest = again.latest()
    assert latest is not None and latest.id == first.id
    assert not list(again.dir.glob(".tmp-*"))


def test_prune_keeps_unpublished_checkpoints(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    p = trained_policy(tiny, "lora")
    store = CheckpointStore(tmp_path, keep=1)
    a = store.write(p, {})
    b = store.write(p, {})
    assert a.path.exists(), "not yet published: must survive pruning"
    store.mark_published(a.id, "v1", "x")
    store.mark_published(b.id, "v2", "y")
    c = store.write(p, {})
    assert not a.path.exists() and not b.path.exists() and c.path.exists()
    assert c.state["parent"] == b.id and store.published()[a.id]["version"] == "v1"
