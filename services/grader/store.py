"""The native runtime's pending table: interaction id -> PendingState for the join partitions a worker
owns, with an index of when each state next needs a timer tick (pure: no Kafka, no clock of its own).

The changelog topic is the durable copy (written in the same transaction as the outputs); this is the
working copy, rebuilt from the changelog whenever the worker is given a partition. States are kept
decoded, because the grader touches most of them once or twice and decoding on every access would cost
more than it saves.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from services.grader.state import PendingState
from services.grader.waiting import WaitingIndex

DueFn = Callable[[PendingState], tuple[float, bool]]
"""state --> (epoch seconds of its next tick, window still open) (`Joiner.due`)."""


class StateStore:
    def __init__(self, due: DueFn) -> None:
        self._due_fn = due
        self.partitions: dict[int, dict[str, PendingState]] = {}
        self._due: dict[str, tuple[float, bool]] = {}
        """key -> (next tick, window open), the truth; heap entries that disagree with it are stale."""
        self._heap: list[tuple[float, str, int]] = []
        self._open = 0
        self.waiting = WaitingIndex()
        """The open windows by tenant and task (waiting.py)."""

    # --- partitions ---------------------------------------------------------------------------------
    def load(self, partition: int, states: Iterable[tuple[str, PendingState]]) -> int:
        """Take over `partition` with the states restored from its changelog; returns how many."""
        self.drop(partition)
        table = self.partitions[partition] = {}
        for key, state in states:
            table[key] = state
            self._index(key, partition, state)
        return len(table)

    def drop(self, partition: int) -> None:
        """Forget `partition` (revoked: another worker owns it now). Its heap entries go stale."""
        for key in self.partitions.pop(partition, {}):
            self._unindex(key)

    def owns(self, partition: int) -> bool:
        return partition in self.partitions

    # --- states ---------------------------------------------------------------------------------------
    def get(self, partition: int, key: str) -> PendingState | None:
        return self.partitions[partition].get(key)

    def put(self, partition: int, key: str, state: PendingState | None, *, not_before: float = 0.0) -> None:
        """Store (or, for None, delete) the state of `key` and re-index its next tick, no earlier than
        `not_before` (a tick that changed nothing is not repeated at once)."""
        table = self.partitions[partition]
        self._unindex(key)
        if state is None:
            table.pop(key, None)
        else:
            table[key] = state
            self._index(key, partition, state, not_before)

    def pop_due(self, now: float) -> list[tuple[int, str]]:
        """(partition, key) of every state whose tick is due at `now`, each once; the caller applies
        the tick and `put`s the result, which indexes the next one."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, key, partition = heapq.heappop(heap)
            current = self._due.get(key)
            if current is not None and current[0] == due and partition in self.partitions:
                self._unindex(key)
                out.append((partition, key))
        if len(heap) > 4 * len(self._due) + 1024:
            self._compact()
        return out

    def retick_open(self, now: float) -> int:
        """Make every open window due at `now` (the runtime rules changed: windows and graders may differ
        now); returns how many."""
        where = {key: p for p, table in self.partitions.items() for key in table}
        keys = [key for key, (_due, open_) in self._due.items() if open_ and key in where]
        for key in keys:
            self._due[key] = (now, True)
            heapq.heappush(self._heap, (now, key, where[key]))
        return len(keys)

    @property
    def open_windows(self) -> int:
        """States whose feedback window is still open (the `pending` gauge)."""
        return self._open

    def __len__(self) -> int:
        return len(self._due)

    # --- index ----------------------------------------------------------------------------------------
    def _index(self, key: str, partition: int, state: PendingState, not_before: float = 0.0) -> None:
        due, open_ = self._due_fn(state)
        due = max(due, not_before)
        self._due[key] = (due, open_)
        self._open += open_
        self.waiting.update(key, state, open_)
        heapq.heappush(self._heap, (due, key, partition))

    def _unindex(self, key: str) -> None:
        old = self._due.pop(key, None)
        if old is not None:
            self._open -= old[1]
        self.waiting.discard(key)

    def _compact(self) -> None:
        """Rebuild the heap from the live index (every update pushes an entry; old ones go stale)."""
        where = {key: p for p, table in self.partitions.items() for key in table}
        self._heap = [(due, key, where[key]) for key, (due, _o) in self._due.items()]
        heapq.heapify(self._heap)
