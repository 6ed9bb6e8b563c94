"""faust runtime: stream partitions whose committed offset stopped short of their end --> re-sought.

Reproduced with tests/integration/test_grader_restart.py (faust, `after_state`, offsets committed before
the crash, `commit_interval_s` 0.02): after the restart the items of some join records were never
graded, two ways, both inside faust: (a) a partition was never fetched again although it held records;
(b) one record never reached the agent while the ones after it did, so faust, which commits only up to
its first unacknowledged offset, kept that partition's committed offset on it for good. Either way the
committed offset stays short of the partition's end while nothing moves it, and the remedy is the same
and safe: resume the partition and seek it back to its committed offset. What the agent already
processed after that offset is replayed, and the join state machine ignores what it already applied
(event ids); what it never received is processed.

`StallTracker` only decides; the app does the Kafka calls. A partition is stalled when its end offset is
past its committed offset and the committed offset has not moved for `after_s` seconds (a live agent
commits every `commit_interval_s`, so the threshold is far above that; a batch that really runs longer
than `after_s` is replayed in part, which costs time, not correctness). A remedy that did not move the
commit while the end stayed put is tried again after twice the previous wait (up to `MAX_BACKOFF` x
`after_s`): an idle source partition whose last records are transaction markers from an outside
producer keeps its commit one short of its end for good (a marker is never delivered to be
acknowledged), and re-reading it every `after_s` forever would only add noise.
"""

from __future__ import annotations

from collections.abc import Mapping

Key = tuple[str, int]
"""(topic, partition)."""


MAX_BACKOFF = 16
"""The longest wait between two remedies of the same stuck commit, in multiples of `after_s`."""


class StallTracker:
    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: dict[Key, tuple[int, int, float, float]] = {}
        """(committed offset, end offset, since when they are unchanged, how long to wait from then)."""

    def stalled(self, ends: Mapping[Key, int], committed: Mapping[Key, int | None], now: float) -> dict[Key, int]:
        """Partitions to resume, with the offset to seek each to. `ends`: end offsets (next offset to be
        written) of the assigned partitions; `committed`: their committed offsets (None: none yet = 0)."""
        out: dict[Key, int] = {}
        for key in [k for k in self._since if k not in ends]:
            del self._since[key]  # no longer assigned
        for key, end in ends.items():
            at = committed.get(key) or 0
            if end <= at:
                self._since.pop(key, None)  # caught up
                continue
            seen = self._since.get(key)
            if seen is None or seen[0] != at:
                self._since[key] = (at, end, now, self.after_s)  # records after the commit: start the clock
            elif seen[1] != end:
                self._since[key] = (at, end, seen[2], self.after_s)  # new records: no back-off
            elif now - seen[2] >= seen[3]:
                out[key] = at
                wait = min(seen[3] * 2, self.after_s * MAX_BACKOFF)
                self._since[key] = (at, end, now, wait)  # give the remedy time before trying again
        return out
