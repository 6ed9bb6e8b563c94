"""StallTracker: a partition whose committed offset stays short of its end for `after_s` is reported
at its committed offset, again after twice the previous wait while nothing changes; one that commits,
or is caught up, never is."""

from __future__ import annotations

from services.grader.core.stall import StallTracker

J0, J1 = ("join", 0), ("join", 1)


def test_a_commit_stuck_before_the_end_is_reported_at_the_committed_offset() -> None:
    t = StallTracker(after_s=10.0)
    assert t.stalled({J0: 15}, {J0: 11}, now=100.0) == {}  # records after the commit: the clock starts
    assert t.stalled({J0: 15}, {J0: 11}, now=105.0) == {}
    assert t.stalled({J0: 15}, {J0: 11}, now=110.0) == {J0: 11}
    assert t.stalled({J0: 15}, {J0: 11}, now=111.0) == {}  # not again before twice after_s
    assert t.stalled({J0: 15}, {J0: 11}, now=120.0) == {}
    assert t.stalled({J0: 15}, {J0: 11}, now=130.0) == {J0: 11}


def test_a_committing_or_caught_up_partition_is_never_reported() -> None:
    t = StallTracker(after_s=10.0)
    for i, now in enumerate(range(0, 100, 5)):  # the commit moves every check; J1 is at its end
        assert t.stalled({J0: 1000, J1: 4}, {J0: i, J1: 4}, now=float(now)) == {}


def test_no_commit_yet_counts_as_offset_zero_and_unassigned_partitions_are_dropped() -> None:
    t = StallTracker(after_s=1.0)
    t.stalled({J0: 9, J1: 9}, {J0: 4, J1: None}, now=0.0)
    assert t.stalled({J0: 9, J1: 9}, {J0: 4, J1: None}, now=2.0) == {J0: 4, J1: 0}
    t.stalled({J1: 9}, {J1: None}, now=2.5)  # J0 revoked
    assert t.stalled({J0: 9}, {J0: 4}, now=3.0) == {}  # back: its clock starts again
    assert t.stalled({J0: 9}, {J0: 4}, now=4.0) == {J0: 4}


def test_a_remedy_that_changes_nothing_is_retried_less_and_less_often() -> None:
    # an idle partition ending in a transaction marker: its commit stays one short of the end for good
    t = StallTracker(after_s=10.0)
    t.stalled({J0: 8}, {J0: 7}, now=0.0)
    reported = [now for now in range(1, 400) if t.stalled({J0: 8}, {J0: 7}, now=float(now))]
    assert reported == [10, 30, 70, 150, 310]  # waits 10, 20, 40, 80, 160 s (the cap: 16 x after_s)


def test_new_records_reset_the_back_off() -> None:
    t = StallTracker(after_s=10.0)
    t.stalled({J0: 8}, {J0: 7}, now=0.0)
    assert t.stalled({J0: 8}, {J0: 7}, now=10.0) == {J0: 7}
    assert t.stalled({J0: 8}, {J0: 7}, now=20.0) == {}  # backing off: 20 s now
    assert t.stalled({J0: 9}, {J0: 7}, now=21.0) == {}  # a record arrived and the commit still did not move
    assert t.stalled({J0: 9}, {J0: 7}, now=31.0) == {J0: 7}
