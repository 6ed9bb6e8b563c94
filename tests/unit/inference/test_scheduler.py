"""Admission of waiting rows into the running batch (services/inference/scheduler.py): the rows x tokens
budget, the tenant share, round-robin between tenants, FIFO within a tenant, and no starvation."""

from __future__ import annotations

import pytest

from services.inference.scheduler import Admission, Budget


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _adm(max_rows: int = 8, max_tokens: int = 1000, share: float = 1.0, overtake: float = 5.0,
         clock: Clock | None = None) -> Admission[str]:
    return Admission(Budget(max_rows, max_tokens, share, overtake), clock=clock or Clock())


def test_budget_caps_rows_and_tokens_and_release_frees_room() -> None:
    a = _adm(max_rows=4, max_tokens=100)
    a.push("big", "t", rows=3, row_tokens=40)          # 120 tokens: only 2 rows fit
    assert a.admit() == [("big", 2, 40)]
    assert (a.rows_in_flight, a.tokens_in_flight) == (2, 80)
    assert a.admit() == []                              # nothing grows past the cap
    a.release("t", 40)
    assert a.admit() == [("big", 1, 40)]
    assert a.waiting() == [] and a.tokens_in_flight == 80
    a.push("rows", "t", rows=5, row_tokens=1)
    assert a.admit() == [("rows", 2, 1)]                # the row cap (4) binds
    assert a.rows_in_flight == 4


def test_tenants_take_turns_row_by_row_and_fifo_within_a_tenant() -> None:
    a = _adm(max_rows=5, max_tokens=10_000)
    a.push("a1", "A", rows=4, row_tokens=10)
    a.push("a2", "A", rows=1, row_tokens=10)
    a.push("b1", "B", rows=1, row_tokens=10)
    a.push("c1", "C", rows=2, row_tokens=10)
    got = dict((item, n) for item, n, _ in a.admit())
    # 5 rows: A, B, C, A, C (B has no more) -> a1 gets 2, b1 1, c1 2; a2 waits behind a1 (FIFO)
    assert got == {"a1": 2, "b1": 1, "c1": 2}
    assert a.waiting() == ["a1", "a2"]


def test_the_tenant_served_first_goes_to_the_back() -> None:
    a = _adm(max_rows=1, max_tokens=10_000)
    for i in range(2):
        a.push(f"a{i}", "A", rows=1, row_tokens=1)
        a.push(f"b{i}", "B", rows=1, row_tokens=1)
    order = []
    for _ in range(4):
        (item, _, _), = a.admit()
        order.append(item)
        a.release(item[0].upper(), 1)
    assert order == ["a0", "b0", "a1", "b1"]


def test_one_tenant_keeps_out_of_the_others_share() -> None:
    """While B has work, a long request of tenant A cannot take the whole engine: B's short request starts
    at once."""
    a = _adm(max_rows=32, max_tokens=32_000, share=0.75)
    a.push("B-short", "B", rows=1, row_tokens=40)
    assert a.admit() == [("B-short", 1, 40)]
    a.push("A-long", "A", rows=16, row_tokens=2_000)      # wants 32,000 tokens
    (item, n, _), = a.admit()
    assert item == "A-long" and n == 12                  # 24,000 = its share
    a.push("B-next", "B", rows=1, row_tokens=40)
    assert a.admit() == [("B-next", 1, 40)]
    assert a.usage("A") == (12, 24_000) and a.usage("B") == (2, 80)
    assert a.over_share() == {}


def test_a_lone_tenant_borrows_and_gives_the_excess_back_when_another_waits() -> None:
    clock = Clock()
    a: Admission[str] = Admission(Budget(32, 32_000, 0.25, 5.0, borrow_after_s=2.0), clock=clock)
    a.push("A-long", "A", rows=16, row_tokens=1_000)
    assert a.admit() == [("A-long", 16, 1_000)]          # alone: 16 rows, twice its share of 8
    assert a.over_share() == {}                          # no one waits
    a.push("B-short", "B", rows=1, row_tokens=40)
    assert a.over_share() == {"A": (8, 8_000)}           # back to 8 rows / 8,000 tokens
    for _ in range(8):                                   # the engine preempts 8 rows and requeues them
        a.release("A", 1_000)
    a.requeue("A-long", "A", 8, 1_000)
    assert a.admit() == [("B-short", 1, 40)]             # A's rows wait: B has work
    assert a.waiting() == ["A-long"] and a.over_share() == {}
    a.release("B", 40)
    clock.t = 1.0
    assert a.admit() == []                               # B idle for 1 s only: A keeps its share
    clock.t = 2.5
    assert a.admit() == [("A-long", 8, 1_000)]           # B idle past borrow_after_s: A borrows again
    assert a.usage("A") == (16, 16_000)


def test_requeued_rows_go_first_in_their_tenants_queue() -> None:
    a = _adm(max_rows=4, max_tokens=1_000)
    a.push("x", "A", rows=2, row_tokens=10)
    assert a.admit() == [("x", 2, 10)]
    a.push("y", "A", rows=4, row_tokens=10)
    a.release("A", 10)
    a.requeue("x", "A", 1, 10)
    assert a.waiting() == ["x", "y"]
    assert a.admit() == [("x", 1, 10), ("y", 2, 10)]


def test_a_row_larger_than_the_share_is_clamped_so_it_can_run() -> None:
    a = _adm(max_rows=4, max_tokens=1_000, share=0.5)
    a.push("huge", "A", rows=1, row_tokens=5_000)
    assert a.admit() == [("huge", 1, 500)]


def test_no_starvation_a_big_request_waits_at_most_max_overtake() -> None:
    clock = Clock()
    a = _adm(max_rows=10, max_tokens=100, share=1.0, overtake=5.0, clock=clock)
    a.push("small-0", "B", rows=1, row_tokens=60)
    assert a.admit() == [("small-0", 1, 60)]
    a.push("big", "A", rows=1, row_tokens=80)           # does not fit while B holds 60
    a.push("small-1", "B", rows=1, row_tokens=30)
    assert a.admit() == [("small-1", 1, 30)]             # overtakes: it fits, the big one does not
    clock.t = 6.0                                        # the big one has waited past max_overtake_s
    a.push("small-2", "C", rows=1, row_tokens=5)
    assert a.admit() == []                               # held: the small one would delay the big one
    a.release("B", 60)
    a.release("B", 30)
    got = a.admit()
    assert got == [("big", 1, 80), ("small-2", 1, 5)]    # it fits now, then the others go on


def test_drop_and_eligibility() -> None:
    a = _adm(max_rows=4, max_tokens=100)
    a.push("x", "A", rows=3, row_tokens=10)
    a.push("y", "A", rows=1, row_tokens=10)
    assert a.admit(eligible=lambda item: item != "x") == [("y", 1, 10)]   # x skipped, not blocking
    assert a.drop("x") == 3 and a.waiting() == []
    assert a.drop("x") == 0
    a.release("A", 10)
    assert a.rows_in_flight == 0
    with pytest.raises(AssertionError, match="released more"):
        a.release("A", 10)
