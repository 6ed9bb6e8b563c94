"""The faust runtime's commit rule: skip offsets that were never fetched, wait for fetched ones."""

from services.grader.stream.commit_offsets import committable, fetched_within


def test_contiguous_acknowledged_offsets_commit_past_the_last() -> None:
    assert committable([10, 11, 12], 10, {10, 11, 12}) == (3, 13)


def test_a_transaction_marker_is_skipped() -> None:
    # records 10, 11, then the commit marker at 12 (never fetched), then 13, 14
    assert committable([10, 11, 13, 14], 10, {10, 11, 13, 14}) == (4, 15)


def test_a_fetched_record_that_was_never_acknowledged_holds_the_commit() -> None:
    # record 12 was fetched and dropped on its way to the agent: commit up to it, not past it
    assert committable([10, 11, 13, 14], 10, {10, 11, 12, 13, 14}) == (2, 12)


def test_a_lost_record_right_at_the_committed_offset_commits_nothing() -> None:
    # faust's own rule (min(acked) - committed > 1) would commit 15 here and lose record 11
    assert committable([12, 13, 14], 11, {11, 12, 13, 14}) == (0, None)


def test_no_commit_yet_is_checked_from_offset_zero() -> None:
    assert committable([3, 4], None, {0, 1, 2, 3, 4}) == (0, None)
    assert committable([3, 4], None, {3, 4}) == (2, 5)  # log starts at 3 (retention): nothing was there


def test_an_aborted_transaction_wider_than_the_scan_range_is_skipped() -> None:
    acked = [0, 1] + [500, 501]  # 2..498 aborted records, 499 the abort marker: none of them fetched
    assert committable(acked, 0, {0, 1, 500, 501}) == (4, 502)
    assert committable(acked, 0, {0, 1, 250, 500, 501}) == (2, 2)


def test_offsets_below_the_committed_one_are_dropped_from_the_acknowledged_list() -> None:
    assert committable([5, 6, 10], 10, {10}) == (3, 11)


def test_fetched_within_is_half_open() -> None:
    assert fetched_within({5}, 5, 6)
    assert not fetched_within({5}, 6, 10)
    assert not fetched_within({100}, 0, 100)
    assert fetched_within({99}, 0, 100)
