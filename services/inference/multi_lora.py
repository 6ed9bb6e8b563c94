"""LoRA adapters as stacked tensors, so that the rows of one batch can each use a different adapter.

A LoRA adapter k changes a linear layer y = x W^T into y = x W^T + s_k (x A_k^T) B_k^T, with A_k (r, in),
B_k (out, r) and the scale s_k = alpha / r (alpha / sqrt(r) with rsLoRA). peft applies one active adapter
to a whole forward pass (its mixed-batch mode loops over the adapters present, one sub-batch each), so a
batch of many tenants would cost one pass per tenant. Here each adapted layer keeps every resident
adapter in one stacked pair A (S, R, in), B (S, out, R) (slot 0 all zeros = no adapter, ranks zero-padded
to the pool's largest rank R, s_k folded into B), and a forward pass gathers each row's pair by its slot
index: two batched matmuls per layer whatever the mix of adapters (`lora_delta`).

Three parts: `load_adapter_weights` (peft's files --> checked, scaled tensors; any thread), `LoraPool`
(slots of one base model; forward hooks on its adapted layers; mutated and routed only on the engine's
scheduler thread) and `lora_delta` (the math). Nothing here knows about tenants or budgets
(adapter_cache.py decides what is resident).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter's files cannot serve on this base model (missing, unsupported feature, wrong shapes)."""


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The LoRA term of a batch whose rows use different adapters.

    x (B, ..., in): the layer's input; a (S, R, in), b (S, out, R): the stacked adapters, the scale folded
    into b; index (B,): each row's slot. Row i gets

        delta_i = (x_i a_{index[i]}^T) b_{index[i]}^T = s_k (x_i A_k^T) B_k^T   with k = index[i],

    so that the layer answers y_i = x_i W^T + delta_i. A slot of zeros (slot 0) gives exactly 0: rows
    without an adapter keep the base layer's numbers bit for bit. Zero-padded ranks add exact zeros too.
    """
    rows = x.shape[0]
    xb = x.reshape(rows, -1, x.shape[-1])                                # (B, T, in)
    a_rows = a.index_select(0, index)                                    # (B, R, in)
    b_rows = b.index_select(0, index)                                    # (B, out, R)
    h = torch.bmm(xb, a_rows.transpose(1, 2))                            # (B, T, R)
    return torch.bmm(h, b_rows.transpose(1, 2)).reshape(*x.shape[:-1], b.shape[1])


@dataclass
class AdapterWeights:
    """One adapter, checked against its base model: per adapted layer (A (r, in), s * B (out, r))."""

    name: str
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _ in self.modules.values())

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.modules.values())


def load_adapter_weights(path: Path, name: str, linears: dict[str, tuple[int, int]], *,
                         dtype: torch.dtype = torch.float32, max_rank: int = 0) -> AdapterWeights:
    """A peft LoRA adapter folder --> `AdapterWeights` for a base whose linear layers are `linears`.

    Refused with `AdapterError` (never half-loaded): another PEFT type, DoRA, trained biases, extra saved
    modules (`modules_to_save`: whole layers, not a low-rank delta), per-layer alphas, embedding or conv
    adapters, a layer the base lacks or of another shape, a rank above `max_rank` (0 = any)."""
    cfg_file = path / "adapter_config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"adapter {name}: cannot read {cfg_file.name}: {e}") from e
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"adapter {name}: type {cfg.get('peft_type')!r} is not LoRA")
    for key, off in (("use_dora", False), ("bias", "none"), ("fan_in_fan_out", False)):
        if cfg.get(key, off) not in (off, None):
            raise AdapterError(f"adapter {name}: {key}={cfg.get(key)!r} is not supported (only {key}={off!r})")
    for key in ("modules_to_save", "alpha_pattern", "layers_to_transform"):
        if cfg.get(key):
            raise AdapterError(f"adapter {name}: {key} is not supported by the multi-adapter engine")
    alpha = float(cfg.get("lora_alpha", cfg.get("r", 8)))
    rslora = bool(cfg.get("use_rslora", False))
    tensors = _read_tensors(path, name)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"adapter {name}: tensor {key!r} is not a LoRA A/B weight of a linear layer")
        pairs.setdefault(m["module"], {})[m["ab"]] = t
    if not pairs:
        raise AdapterError(f"adapter {name}: no LoRA weights in {path}")
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"adapter {name}: layer {module} lacks lora_{'B' if 'A' in ab else 'A'}")
        if module not in linears:
            raise AdapterError(f"adapter {name}: the base model has no linear layer {module!r}")
        a, b = ab["A"], ab["B"]
        fan_in, fan_out = linears[module]
        r = a.shape[0] if a.dim() == 2 else -1
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != fan_in or b.shape != (fan_out, r):
            raise AdapterError(f"adapter {name}: layer {module} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                               f"the base layer needs A (r, {fan_in}) and B ({fan_out}, r)")
        if max_rank and r > max_rank:
            raise AdapterError(f"adapter {name}: rank {r} is above the engine's limit {max_rank} "
                               "(APPRENTICE_INFERENCE_ADAPTER_MAX_RANK)")
        scale = alpha / (r ** 0.5 if rslora else r)
        modules[module] = (a.to(dtype).contiguous(), (b.to(torch.float32) * scale).to(dtype).contiguous())
    return AdapterWeights(name, modules)


def _read_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    # safetensors only: a pickled adapter_model.bin is never loaded (shared/weights/formats.py)
    st = path / "adapter_model.safetensors"
    try:
        if st.exists():
            return dict(load_file(st, device="cpu"))
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad adapter, reported with its cause
        raise AdapterError(f"adapter {name}: cannot read its weights: {type(e).__name__}: {e}") from e
    raise AdapterError(f"adapter {name}: no adapter_model.safetensors in {path} (pickled .bin adapters are "
                       "refused)")


class LoraPool:
    """The resident adapters of one base model, stacked per adapted layer, and the per-row routing of a
    forward pass. Slot 0 is reserved (zeros); `put` and `clear` resize or write the stacks, `route` sets
    the slots of the batch rows for the forward passes inside it. Not thread-safe: one scheduler thread
    owns it (forward passes and mutations never overlap)."""

    def __init__(self, model: Any, *, grow: int = 8, max_slots: int = 0) -> None:
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self._modules = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        self.linears = {n: (m.in_features, m.out_features) for n, m in self._modules.items()}
        self.rank = 0
        self.capacity = 1                                     # slots allocated, slot 0 included
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self._grow = max(1, grow)
        self._max_slots = max_slots               # adapters resident at most (0 = unknown): caps the growth
        self._free: list[int] = []
        self._used: set[int] = set()
        self._hooks: list[Any] = []
        self._index: torch.Tensor | None = None
        self._single: int | None = None
        self._stamps: dict[int, int] = {}      # slot -> which put() filled it (prompt-cache identity)
        self._puts = 0

    # --- memory -----------------------------------------------------------------------------------------
    def slot_bytes(self, extra: AdapterWeights | None = None) -> int:
        """Bytes one slot takes in every stack (with `extra`'s layers and rank added, if given)."""
        names = set(self.a) | (set(extra.modules) if extra is not None else set())
        rank = max(self.rank, extra.rank if extra is not None else 0)
        size = torch.empty((), dtype=self.dtype).element_size()
        return sum(rank * (self.linears[n][0] + self.linears[n][1]) * size for n in names)

    @property
    def resident(self) -> int:
        return len(self._used)

    def put(self, w: AdapterWeights) -> int:
        """Copy `w` into a free slot (growing the stacks, their rank or their layers as needed); its slot."""
        if w.rank > self.rank:
            self._resize(self.capacity, w.rank)
        for name in w.modules:
            if name not in self.a:
                self._add_layer(name)
        if not self._free:                # grow by half (at least `grow`): copies stay linear in the adapters
            more = max(self._grow, self.capacity // 2)
            if self._max_slots:
                more = max(1, min(more, self._max_slots + 1 - self.capacity))
            self._resize(self.capacity + more, self.rank)
        slot = self._free.pop(0)
        for name, (a, b) in w.modules.items():
            r = a.shape[0]
            self.a[name][slot].zero_()
            self.b[name][slot].zero_()
            self.a[name][slot, :r].copy_(a)
            self.b[name][slot, :, :r].copy_(b)
        for name in self.a:
            if name not in w.modules:
                self.a[name][slot].zero_()
                self.b[name][slot].zero_()
        self._used.add(slot)
        self._puts += 1
        self._stamps[slot] = self._puts
        return slot

    def slot_key(self, slot: int) -> int:
        """An identity of the adapter in `slot` that no later adapter in the same slot shares (0: base)."""
        return 0 if slot == 0 else self._stamps.get(slot, -slot)

    def clear(self, slot: int) -> None:
        """Free `slot` (its stacks are zeroed when it is reused)."""
        assert slot in self._used, f"slot {slot} is not in use"
        self._used.discard(slot)
        self._free.append(slot)
        self._free.sort()

    def _resize(self, capacity: int, rank: int) -> None:
        for name, (fan_in, fan_out) in ((n, self.linears[n]) for n in self.a):
            a = torch.zeros((capacity, rank, fan_in), dtype=self.dtype, device=self.device)
            b = torch.zeros((capacity, fan_out, rank), dtype=self.dtype, device=self.device)
            old_a, old_b = self.a[name], self.b[name]
            a[:old_a.shape[0], :old_a.shape[1]].copy_(old_a)
            b[:old_b.shape[0], :, :old_b.shape[2]].copy_(old_b)
            self.a[name], self.b[name] = a, b
        self._free.extend(range(self.capacity, capacity))
        self.capacity, self.rank = capacity, rank

    def _add_layer(self, name: str) -> None:
        fan_in, fan_out = self.linears[name]
        self.a[name] = torch.zeros((self.capacity, self.rank, fan_in), dtype=self.dtype, device=self.device)
        self.b[name] = torch.zeros((self.capacity, fan_out, self.rank), dtype=self.dtype, device=self.device)
        self._hooks.append(self._modules[name].register_forward_hook(functools.partial(self._hook, name)))

    # --- forward --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def route(self, slots: torch.Tensor) -> Iterator[None]:
        """Forward passes inside apply slot `slots[i]` to batch row i (0 = base weights only)."""
        if not self.a or not bool((slots != 0).any()):
            yield                                                 # base only: no LoRA work at all
            return
        first = int(slots[0])
        self._single = first if bool((slots == first).all()) else None
        self._index = slots.to(self.device)
        try:
            yield
        finally:
            self._index, self._single = None, None

    def _hook(self, name: str, module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor | None:
        index = self._index
        if index is None:
            return None
        x = args[0]
        k = self._single
        if k is not None:                 # one adapter for the whole batch: plain matmuls, nothing gathered
            return output + (x @ self.a[name][k].transpose(0, 1)) @ self.b[name][k].transpose(0, 1)
        return output + lora_delta(x, self.a[name], self.b[name], index)


def save_adapter(path: Path, modules: dict[str, tuple[torch.Tensor, torch.Tensor]], *, alpha: float) -> Path:
    """Write LoRA weights (per layer: A (r, in), B (out, r), unscaled) in peft's layout, which
    `load_adapter_weights` (and peft) read: for generated adapters in tests and benchmarks."""

    path.mkdir(parents=True, exist_ok=True)
    ranks = {a.shape[0] for a, _ in modules.values()}
    assert len(ranks) == 1, "one rank for every layer (peft's rank_pattern is not written)"
    tensors: dict[str, torch.Tensor] = {}
    for name, (a, b) in modules.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": ranks.pop(), "lora_alpha": alpha, "bias": "none", "use_dora": False,
           "use_rslora": False, "fan_in_fan_out": False, "task_type": "CAUSAL_LM",
           "target_modules": sorted({n.rsplit(".", 1)[-1] for n in modules})}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return path
