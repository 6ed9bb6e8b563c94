"""Every loader of stored weights reads safetensors only (issue #33, SECURITY.md §4 the Weights rows).

The attack: peft's `PeftModel.from_pretrained` falls back to `torch.load("adapter_model.bin")` when a folder
has no `adapter_model.safetensors` (it has no switch to refuse for a local folder), and the trainer unpickled
its own `training.pt` with `weights_only=False`, so a checkpoint folder an attacker could write ran code
in the trainer or in every process that loads a version. Here real adapters and models of the tiny model
are saved as pickles and handed to each loader: the trainer's policy (LoRA and full resume), the version
loader (shared/weights/client.py `load_version`), the inference pool's adapter reader, and the trainer's
training-state reader. Each refuses, naming safetensors; nothing is unpickled.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from services.inference.multi_lora import AdapterError, load_adapter_weights
from services.trainer.policy import Policy, PolicyConfig
from shared.proto.apprentice.v1 import weights_pb2
from shared.weights.client import FULL, LORA, load_version, save_version_files
from shared.weights.formats import UnsafeWeights

MARKER: list[str] = []
"""Appended to by `_Payload` when it is unpickled: the proof that a loader ran code."""


def _ran(tag: str) -> None:
    MARKER.append(tag)


class _Payload:
    """A pickle that calls `_ran` when loaded, as a real attack would call `os.system`."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _ran, ("unpickled",)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> dict[str, Path]:
    """A LoRA adapter and a full model of the tiny model, each saved as a pickle only and as safetensors
    with a planted pickle beside it."""
    from peft import LoraConfig, get_peft_model

    from shared.models import load_model

    tmp = tmp_path_factory.mktemp("pickled")
    model, _ = load_model(tiny_model_name)
    peft = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    out = {}
    peft.save_pretrained(str(tmp / "lora-bin"), safe_serialization=False)      # adapter_model.bin
    save_version_files(peft, tmp / "lora-planted", LORA)
    torch.save({"x": _Payload()}, tmp / "lora-planted" / "adapter_model.bin")
    base, _ = load_model(tiny_model_name)
    base.save_pretrained(tmp / "full-bin")   # transformers 5 writes safetensors only: swapped for the pickle
    (tmp / "full-bin" / "model.safetensors").unlink()
    torch.save(base.state_dict(), tmp / "full-bin" / "pytorch_model.bin")
    save_version_files(base, tmp / "full-planted", FULL)
    torch.save({"x": _Payload()}, tmp / "full-planted" / "pytorch_model.bin")
    for name in ("lora-bin", "lora-planted", "full-bin", "full-planted"):
        out[name] = tmp / name
    assert (out["lora-bin"] / "adapter_model.bin").exists() and not list(out["lora-bin"].glob("*.safetensors"))
    assert not list(out["full-bin"].glob("*.safetensors"))
    return out


@pytest.mark.parametrize("name", ["lora-bin", "lora-planted"])
def test_an_adapter_folder_with_a_pickle_is_refused_by_every_loader(dirs: dict[str, Path], name: str,
                                                                    tiny_model_name: str) -> None:
    manifest = weights_pb2.Manifest(model=tiny_model_name, version="v1", kind=LORA)
    with pytest.raises(UnsafeWeights, match="safetensors"):
        load_version(manifest, dirs[name], tiny_model_name)
    with pytest.raises(UnsafeWeights, match="safetensors"):
        Policy(PolicyConfig(model_name=tiny_model_name, finetune=LORA, device="cpu"), init_dir=dirs[name])
    if name == "lora-bin":  # the inference pool reads the safetensors file only (services/inference/multi_lora.py)
        with pytest.raises(AdapterError, match="safetensors"):
            load_adapter_weights(dirs[name], "v1", {})
    assert not MARKER


@pytest.mark.parametrize("name", ["full-bin", "full-planted"])
def test_a_model_folder_with_a_pickle_is_refused_by_every_loader(dirs: dict[str, Path], name: str,
                                                                 tiny_model_name: str) -> None:
    manifest = weights_pb2.Manifest(model=tiny_model_name, version="v1", kind=FULL)
    with pytest.raises(UnsafeWeights, match="safetensors"):
        load_version(manifest, dirs[name], tiny_model_name)
    with pytest.raises(UnsafeWeights, match="safetensors"):
        Policy(PolicyConfig(model_name=tiny_model_name, finetune=FULL, device="cpu"), init_dir=dirs[name])
    assert not MARKER


def test_a_safetensors_adapter_still_loads(dirs: dict[str, Path], tiny_model_name: str, tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    shutil.copytree(dirs["lora-planted"], clean)
    (clean / "adapter_model.bin").unlink()
    manifest = weights_pb2.Manifest(model=tiny_model_name, version="v1", kind=LORA)
    assert hasattr(load_version(manifest, clean, tiny_model_name), "peft_config")
    policy = Policy(PolicyConfig(model_name=tiny_model_name, finetune=LORA, device="cpu"), init_dir=clean)
    state = tmp_path / "training.pt"
    policy.save_training_state(state)
    policy.load_training_state(state)            # the trainer's own state still round-trips


def test_a_tampered_training_state_runs_no_code(tiny_model_name: str, tmp_path: Path) -> None:
    policy = Policy(PolicyConfig(model_name=tiny_model_name, finetune=LORA, device="cpu"))
    state = tmp_path / "training.pt"
    torch.save({"optimizer": _Payload(), "steps": 1}, state)
    with pytest.raises(pickle.UnpicklingError):
        policy.load_training_state(state)
    assert not MARKER, "loading the trainer's state unpickled arbitrary code"
