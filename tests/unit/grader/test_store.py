"""The native runtime's in-memory pending table: partitions, due-time index, open-window count."""

from __future__ import annotations

from services.grader.store import StateStore

from services.grader.core.state import PendingState


def due(st: PendingState) -> tuple[float, bool]:
    return st.deadline, not st.closed


def state(key: str, deadline: float, closed: bool = False) -> PendingState:
    return PendingState(key, deadline=deadline, closed=closed)


def test_load_get_put_delete_and_drop() -> None:
    s = StateStore(due)
    assert s.load(2, [("a", state("a", 10)), ("b", state("b", 20, closed=True))]) == 2
    assert s.owns(2) and not s.owns(1) and len(s) == 2 and s.open_windows == 1
    assert s.get(2, "a") is not None and s.get(2, "zz") is None
    s.put(2, "c", state("c", 5))
    assert s.open_windows == 2
    s.put(2, "a", None)
    assert s.get(2, "a") is None and s.open_windows == 1 and len(s) == 2
    s.drop(2)
    assert not s.owns(2) and len(s) == 0 and s.open_windows == 0 and s.pop_due(1e9) == []


def test_pop_due_returns_each_due_key_once_in_time_order() -> None:
    s = StateStore(due)
    s.load(0, [("late", state("late", 30)), ("early", state("early", 10))])
    s.load(1, [("mid", state("mid", 20))])
    assert s.pop_due(5) == []
    assert s.pop_due(25) == [(0, "early"), (1, "mid")]
    assert s.pop_due(25) == []  # popped keys wait for the caller's put
    s.put(0, "early", state("early", 40))
    s.put(0, "late", state("late", 35))  # re-indexed: the old entry (30) is stale
    assert s.pop_due(36) == [(0, "late")]
    assert s.pop_due(100) == [(0, "early")]


def test_not_before_delays_a_tick_that_changed_nothing_and_dropped_partitions_are_skipped() -> None:
    s = StateStore(due)
    s.load(0, [("k", state("k", 10))])
    [(p, k)] = s.pop_due(11)
    s.put(p, k, s.get(p, k), not_before=41)
    assert s.pop_due(40) == [] and s.pop_due(41) == [(0, "k")]
    s.load(3, [("x", state("x", 1))])
    s.drop(3)
    assert s.pop_due(50) == []


def test_the_heap_is_compacted_when_stale_entries_pile_up() -> None:
    s = StateStore(due)
    s.load(0, [])
    for i in range(3000):
        s.put(0, "k", state("k", 1000 + i))
    s.pop_due(0)
    assert len(s._heap) < 3000
    assert s.pop_due(10_000) == [(0, "k")]
