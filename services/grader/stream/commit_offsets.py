"""faust runtime: acknowledged + fetched offsets of a partition --> the offset that is safe to commit.

An offset between the committed one and an acknowledged one that was never acknowledged is one of two
things, and only the fetcher can tell which:
- never fetched: no record there for this consumer (a transaction's commit or abort marker, the records
  of an aborted transaction under read_committed, a compacted-away key). Committing over it loses
  nothing, and refusing to would hold the partition back for good;
- fetched but never acknowledged: a record faust dropped on its way to the agent (a batch cut short by a
  rebalance, a record of a partition that was not active at that moment). Committing over it loses that
  record; the commit has to wait until it is processed (the stall watchdog re-reads it, stall.py).

faust's own rule (`min(acked) - committed > 1`, with every skipped offset of a read "gap" counted as
acknowledged) cannot tell them apart: it commits over one lost record, and the gap bookkeeping counted
records that were fetched and then dropped as acknowledged too. `committable` decides from what was
fetched instead.
"""

from __future__ import annotations

from collections.abc import Collection

SCAN_RANGE = 64
"""Up to this many offsets between two acknowledged ones are looked up one by one; wider ranges (a long
aborted transaction, compaction) are checked by one pass over the fetched set instead."""


def fetched_within(fetched: Collection[int], lo: int, hi: int) -> bool:
    """Whether any offset o with lo <= o < hi was fetched."""
    if hi - lo <= SCAN_RANGE:
        return any(o in fetched for o in range(lo, hi))
    return any(lo <= o < hi for o in fetched)


def committable(acked: list[int], committed: int | None, fetched: Collection[int]) -> tuple[int, int | None]:
    """(how many of the sorted `acked` offsets the commit covers, the offset to commit or None).

    `committed` is the next offset to read as last committed (None: nothing committed yet, or 0, as faust
    keeps it). Walking the acknowledged offsets in order from `committed`, each unacknowledged offset
    before the next acknowledged one may be skipped only if it was never fetched; the commit is the
    offset after the last acknowledged offset reached. E.g. committed 10, acked [10, 11, 13, 14]:
    13 is reached when 12 was not fetched (a marker: commit 15), not when it was (a lost record: commit 12).
    """
    pos = committed if committed is not None else 0
    taken = 0
    for a in acked:
        if a >= pos:
            if a > pos and fetched_within(fetched, pos, a):
                break
            pos = a + 1
        taken += 1
    return taken, (pos if taken else None)
