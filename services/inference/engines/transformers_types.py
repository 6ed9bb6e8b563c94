"""What the transformers engine (transformers_engine.py) and its continuous scheduler (continuous.py) share.

The served versions (`Backbone`, `Policy`), a submitted request as it waits (`Queued`), and `SchedulerHost`:
the part of the engine the scheduler drives from its thread (the queue, its condition and the
between-step tasks, the adapter cache, the decoding facts). They live here, below both modules, so the
engine imports its scheduler and the scheduler never imports the engine back (no import cycle, not even
a type-only one); mypy checks that `TransformersEngine` satisfies `SchedulerHost` where it builds its
scheduler.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.inference.adapter_cache import AdapterCache
from services.inference.engines.base import RequestHandle
from services.inference.multi_lora import LoraPool
from services.inference.settings import InferenceSettings
from shared.decoding.prompt_cache import PromptCache


@dataclass
class Backbone:
    """One set of full weights in memory, plus the LoRA versions registered on it (if any)."""

    version: str
    model: Any
    lora: LoraPool | None = None          # the resident adapters' stacked weights, once one is registered
    adapters: set[str] = field(default_factory=set)
    prompts: PromptCache | None = None    # recent prefills on these weights (continuous scheduler)


@dataclass
class Policy:
    """A servable version: a backbone, optionally with one of its LoRA adapters (named as the version)."""

    version: str
    backbone: Backbone
    adapter: str | None = None


@dataclass
class Queued:
    """A submitted request and the version it was submitted to (it keeps that one across a swap)."""

    handle: RequestHandle
    policy: Policy


class SchedulerHost(Protocol):
    """The engine as its continuous scheduler uses it; `TransformersEngine` implements it.

    The underscored members are the engine's own scheduling state, shared only with the scheduler that
    runs on its thread: `_cv` guards `_queue`, `_tasks`, `_stopping` and `_running`.
    """

    settings: InferenceSettings
    adapters: AdapterCache
    _tok: Any
    """The tokenizer (set once the model is loaded)."""
    _eos: set[int]
    _ctx: int
    """The context window in tokens."""
    _cv: threading.Condition
    _queue: deque[Queued]
    """Submitted, not yet taken by the scheduler."""
    _tasks: deque[tuple[Callable[[], Any], Future[Any]]]
    """Work to run on the scheduler thread between steps (version loads and unloads)."""
    _stopping: bool
    _running: list[Queued]
    """Taken from the queue, not finished (what `shutdown` cancels)."""

    @property
    def context_window(self) -> int: ...

    def _run_tasks(self) -> None:
        """Run the queued between-step tasks, handing each result or error to its waiting caller."""
        ...
