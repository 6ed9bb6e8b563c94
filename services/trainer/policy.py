"""Base model + checkpoint --> the trainable policy: LoRA or full weights, AdamW, autocast, snapshots.

Everything a training step needs from the model lives here, so the RL and distillation code see one
object: `policy.scorer` (token log-probs / top-k KL), `policy.step()` (clip + optimizer step),
`policy.snapshot()` (a frozen copy: the OEL teacher), `policy.reference()` (π_ref for KL).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.trainer.distributed import all_reduce_grads
from services.trainer.logprobs import Scorer
from services.trainer.schedule import warmup_lr
from shared.models import load_model, load_tokenizer
from shared.weights.client import FULL, LORA, save_version_files
from shared.weights.formats import require_safetensors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyConfig:
    model_name: str
    finetune: str = LORA            # lora | full
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"
    lr: float = 5e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0           # linear lr warm-up over the first optimizer steps (schedule.py)
    dtype: str = "auto"             # auto | fp32 | bf16
    device: str = "auto"
    seed: int = 0
    head_chunk: int = 0             # 0 = by device (CPU 64 rows: cache-sized; CUDA 4096)

    @classmethod
    def from_settings(cls, s: Any) -> PolicyConfig:
        ft = s.finetune
        lora = ({"lora_r": ft.rank, "lora_alpha": ft.alpha, "lora_dropout": ft.dropout, "lora_targets": ft.targets}
                if ft.kind == LORA else {})
        return cls(model_name=s.common.model, finetune=ft.kind, lr=s.lr, weight_decay=s.weight_decay,
                   grad_clip=s.grad_clip, warmup_steps=s.warmup_steps, dtype=s.dtype, device=s.device, seed=s.seed,
                   head_chunk=s.head_chunk, **lora)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Policy:
    """The model being trained. `init_dir` is a checkpoint's weights folder to resume from."""

    def __init__(self, cfg: PolicyConfig, *, model: nn.Module | None = None, tokenizer: Any = None,
                 init_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        seed_everything(cfg.seed)
        if model is None and init_dir is not None and cfg.finetune == FULL:
            # heavy: transformers, only when a policy is built
            from transformers import AutoModelForCausalLM

            require_safetensors(init_dir, adapter=False)  # a planted .bin is refused, never unpickled
            model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32, use_safetensors=True)
        if model is None:
            model, tokenizer = load_model(cfg.model_name)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model_name)
        model.to(self.device)
        if cfg.finetune == LORA:
            model = self._with_lora(model, init_dir)
        elif cfg.finetune != FULL:
            raise ValueError(f"unknown finetune mode {cfg.finetune!r} (use 'lora' or 'full')")
        self.model: Any = model
        self.model.train()
        self._ref: nn.Module | None = None   # full fine-tuning: frozen copy of the base for KL
        params = [p for p in self.model.parameters() if p.requires_grad]
        assert params, "nothing to train: every parameter is frozen"
        # fused AdamW on CUDA: one kernel for all (LoRA: hundreds of small) tensors instead of a loop
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           fused=self.device.type == "cuda")
        chunk = cfg.head_chunk or (4096 if self.device.type == "cuda" else 64)
        self.scorer = Scorer(self.model, chunk=chunk)
        self.steps = 0
        self.last_lr = cfg.lr      # the learning rate of the last optimizer step (step metrics report it)

    # --- construction -------------------------------------------------------------------------------
    def _with_lora(self, model: nn.Module, init_dir: Path | None) -> nn.Module:
        # heavy: peft (4 s to import), only for LoRA training
        from peft import LoraConfig, PeftModel, get_peft_model

        if hasattr(model, "peft_config"):
            return model
        if init_dir is not None:
            # peft loads adapter_model.bin with torch.load when the safetensors file is missing (it has no
            # use_safetensors switch for a local folder): the directory is checked first (shared/weights/formats.py).
            require_safetensors(init_dir, adapter=True)
            return PeftModel.from_pretrained(model, init_dir, is_trainable=True)
        raw = self.cfg.lora_targets
        targets: str | list[str] = raw if raw == "all-linear" else [t.strip() for t in raw.split(",") if t.strip()]
        lcfg = LoraConfig(r=self.cfg.lora_r, lora_alpha=self.cfg.lora_alpha, lora_dropout=self.cfg.lora_dropout,
                          target_modules=targets, task_type="CAUSAL_LM")
        return get_peft_model(model, lcfg)

    @property
    def kind(self) -> str:
        return self.cfg.finetune

    @property
    def pad_id(self) -> int:
        t = self.tokenizer
        return int(t.pad_token_id if t.pad_token_id is not None else t.eos_token_id)

    # --- numerics -----------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where the hardware has it (CUDA with bf16), else a no-op (fp32)."""
        use_bf16 = self.cfg.dtype == "bf16" or (
            self.cfg.dtype == "auto" and self.device.type == "cuda" and torch.cuda.is_bf16_supported())
        if use_bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step (the warm-up's, schedule.py)."""
        return warmup_lr(self.cfg.lr, self.steps, self.cfg.warmup_steps)

    def step(self) -> float:
        """Clip the global grad norm, take one optimizer step at this step's learning rate, zero grads.
        Returns the pre-clip norm."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        all_reduce_grads(params)                  # torchrun: sum the ranks' shares (no-op in one process)
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))
        self.last_lr = self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = self.last_lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return float(norm)

    # --- frozen views ---------------------------------------------------------------------------------
    def snapshot(self) -> nn.Module:
        """A frozen copy of the current policy (LoRA merged into plain weights): the OEL round-start
        teacher, and π_old when several optimizer steps share one batch."""
        m: Any = copy.deepcopy(self.model)
        if hasattr(m, "merge_and_unload"):
            m = m.merge_and_unload()
        m.eval()
        for p in m.parameters():
            p.requires_grad_(False)
        return m

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """π_ref = the base model: LoRA disables its adapters (free); full fine-tuning keeps one frozen copy
        made on first use (before this process's first step it equals the loaded weights)."""
        if self.kind == LORA:
            with self.model.disable_adapter():
                yield self.model
            return
        if self._ref is None:
            self._ref = load_model(self.cfg.model_name)[0].to(self.device)
            for p in self._ref.parameters():
                p.requires_grad_(False)
        yield self._ref

    # --- persistence --------------------------------------------------------------------------------
    def save_weights(self, dest: Path) -> str:
        """Version layout (weights_client): adapter or full safetensors + configs. Returns the kind."""
        return save_version_files(self.model, dest, self.kind)

    def save_training_state(self, dest: Path) -> None:
        torch.save({"optimizer": self.optimizer.state_dict(), "steps": self.steps,
                    "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}, dest)

    def load_training_state(self, src: Path) -> None:
        # weights_only: tensors, numbers and containers only; a tampered file cannot run code when unpickled
        state = torch.load(src, map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        torch.set_rng_state(state["torch_rng"].cpu())
        random.setstate(state["py_rng"])
