"""The engine boundary: validated generation requests --> streamed tokens and finished samples.

An engine owns the weights (the base model plus any hot-swapped versions) and the scheduling of
requests onto them. The gRPC layer, capture and routing never touch torch; they talk to this ABC.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.contracts.orders import BASE
from shared.decoding.params import Sample, SamplingConfig

BASE_VERSION = BASE


class EngineError(RuntimeError):
    """Generation failed inside the engine (a bug or a broken model): the request fails with INTERNAL,
    the engine keeps serving the others."""


class EngineStopped(RuntimeError):
    """The engine is shutting down and takes no new requests (recoverable: retry on another pod)."""


class UnknownVersion(KeyError):
    """The routed version is not loaded here (it was unloaded between routing and submission)."""


@dataclass(frozen=True)
class VersionFiles:
    """A downloaded version, ready to load: what `Weights.Download` put on disk plus its manifest facts."""

    version: str
    kind: str                   # full | lora
    path: Path
    base_version: str = BASE_VERSION   # lora: the full version the adapter applies to
    tenant: str = ""


@dataclass
class GenerationRequest:
    """One validated request: prompt tokens, sampling, the version routed to, and its deadline."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingConfig
    version: str = BASE_VERSION
    stream: bool = False
    deadline: float | None = None       # time.monotonic() after which generation is cancelled
    tenant: str = ""                    # who asked: the continuous scheduler takes turns between tenants


@dataclass
class Delta:
    """Streamed piece of one choice: new token ids and the text they completed (may be empty)."""

    index: int
    token_ids: list[int]
    text: str


@dataclass
class ChoiceDone:
    index: int
    sample: Sample


class RequestHandle:
    """The caller's side of a submitted request: a stream of `Delta`/`ChoiceDone` events, then the end.

    Thread-safe: the engine thread pushes events, one gRPC handler thread consumes them.
    """

    _END = object()

    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None       # first decode step (queue time = started - submitted)
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._events: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._samples: dict[int, Sample] = {}
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()                  # guards _callbacks against a concurrent finish
        self._callbacks: list[Callable[[RequestHandle], None]] = []

    # --- engine side ------------------------------------------------------------------------------
    def cancelled(self) -> bool:
        d = self.request.deadline
        return self._cancel.is_set() or (d is not None and time.monotonic() >= d)

    def push_delta(self, index: int, token_ids: list[int], text: str) -> None:
        if self._done.is_set():
            return                     # failed (or finished) already: late events of its rows are dropped
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self._events.put(Delta(index, list(token_ids), text))

    def push_choice(self, index: int, sample: Sample) -> None:
        if self._done.is_set():
            return
        if self.first_token_at is None and sample.token_ids:
            self.first_token_at = time.monotonic()
        self._samples[index] = sample
        self._events.put(ChoiceDone(index, sample))
        if len(self._samples) == max(1, self.request.sampling.n):
            self._finish()

    def fail(self, error: BaseException) -> None:
        if self._done.is_set():
            return
        self._error = error
        self._finish()

    def _finish(self) -> None:
        self.finished_at = time.monotonic()
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        self._events.put(self._END)
        for fn in callbacks:
            fn(self)

    def add_done_callback(self, fn: Callable[[RequestHandle], None]) -> None:
        """Call `fn(handle)` once the request is done (every choice, or a failure); at once if it is."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    @property
    def generated_tokens(self) -> int:
        """Tokens generated so far by the finished choices (for token quotas and usage)."""
        return sum(len(s.token_ids) for s in list(self._samples.values()))

    # --- caller side ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop generating (client went away, deadline): unfinished choices end as `cancelled`."""
        self._cancel.set()

    def has_choice(self, index: int) -> bool:
        return index in self._samples

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def events(self, timeout: float | None = None) -> Iterator[Delta | ChoiceDone]:
        """Events until the request completes; raises the engine's error, or TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ev = self._events.get(timeout=left)
            except queue.Empty:
                raise TimeoutError("generation did not finish in time") from None
            if ev is self._END:
                if self._error is not None:
                    raise self._error
                return
            yield ev

    def result(self, timeout: float | None = None) -> list[Sample]:
        """Block until every choice is done; samples ordered by choice index."""
        if not self._done.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        if self._error is not None:
            raise self._error
        return [self._samples[i] for i in sorted(self._samples)]


@dataclass
class EngineInfo:
    name: str
    model: str
    context_window: int
    versions: list[str] = field(default_factory=list)


class Engine(ABC):
    """Serve generation for one model family: a base model plus hot-swapped full / LoRA versions."""

    name: str = "abstract"
    max_full_versions: int | None = None
    """How many sets of full weights the engine can hold at once (None = as memory allows). LoRA
    adapters do not count; they need their base loaded."""

    @abstractmethod
    def start(self) -> None:
        """Load the base model and start scheduling; returns when the engine can serve."""

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer (chat template, encode, decode) shared by every version."""

    @property
    @abstractmethod
    def context_window(self) -> int:
        """Prompt + completion tokens one sequence may hold."""

    @abstractmethod
    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request on `request.version`; never blocks on generation. Raises UnknownVersion or
        EngineStopped."""

    @abstractmethod
    def load_version(self, files: VersionFiles) -> None:
        """Load a downloaded version off the serving path and make it servable; raises on failure, leaving
        every loaded version untouched."""

    @abstractmethod
    def unload_version(self, version: str) -> None:
        """Free a version once nothing routes to it (requests already queued on it still finish)."""

    @abstractmethod
    def loaded_versions(self) -> list[str]:
        """Versions that `submit` accepts now (always includes `base`)."""

    @abstractmethod
    def shutdown(self, timeout: float = 10.0) -> None:
        """Refuse new requests, let queued and running ones finish within `timeout`, then cancel the rest."""

    def healthy(self) -> bool:
        """False once the engine can no longer serve (its scheduler died): health turns NOT_SERVING."""
        return True

    def info(self, model: str) -> EngineInfo:
        return EngineInfo(self.name, model, self.context_window, self.loaded_versions())
