"""One sequence being decoded (`DecodeRow`), what a batch counts (`BatchStats`), and the per-row adapter
hook (`RowRouter`): the decode loop's inputs and outputs besides the model."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from shared.decoding.constraints import Constraint
from shared.decoding.params import Sample, SamplingConfig
from shared.decoding.text import first_stop


@dataclass
class DecodeRow:
    """One sequence to decode and its running state.

    Callbacks are invoked on the decoding thread: `on_delta(token_ids, text)` while streaming (only when
    `stream`), `on_finish(sample)` exactly once. `cancelled()` is polled every step.
    """

    prompt_ids: list[int]
    params: SamplingConfig
    sample_index: int = 0
    stream: bool = False
    on_delta: Callable[[list[int], str], None] | None = None
    on_finish: Callable[[Sample], None] | None = None
    cancelled: Callable[[], bool] = lambda: False
    adapter: int = 0                       # LoRA slot in the batch router (0 = base weights)
    cache_salt: str = ""                   # prompt-cache namespace (the tenant): no entry is shared across salts
    # --- state ---
    generator: torch.Generator | None = None   # a seeded row's draws so far, kept while it is preempted
    constraint: Constraint | None = None   # its grammar's matcher (params.grammar), kept while it is preempted
    sample: Sample = field(default_factory=Sample)
    streamed: int = 0                      # characters of text already streamed
    pending_ids: list[int] = field(default_factory=list)   # token ids not yet streamed
    done: bool = False

    def finish(self, reason: str, eos_ids: set[int], tok: Any) -> None:
        s = self.sample
        s.finish_reason = reason
        if not (self.params.stop or self.stream) or reason == "cancelled":
            s.text = tok.decode([i for i in s.token_ids if i not in eos_ids], skip_special_tokens=True)
            if reason == "cancelled" and self.params.stop:
                cut = first_stop(s.text, self.params.stop)
                s.text = s.text[:cut] if cut >= 0 else s.text
        if self.stream and self.on_delta is not None and (len(s.text) > self.streamed or self.pending_ids):
            self.on_delta(self.pending_ids, s.text[self.streamed:])
            self.streamed, self.pending_ids = len(s.text), []
        self.done = True
        if self.on_finish is not None:
            self.on_finish(s)


class RowRouter(Protocol):
    """Applies per-row adapters to the forward passes run inside `route` (row i gets slot slots[i])."""

    def route(self, slots: torch.Tensor) -> AbstractContextManager[None]: ...


@dataclass
class BatchStats:
    rows: int = 0
    steps: int = 0                         # forward passes (prefills included)
    tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cached_prompts: int = 0                # prompts joined from the prompt cache, without a forward pass
