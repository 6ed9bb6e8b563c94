"""The capture sink's acknowledgment ticket: set only once the event is in the spool on disk, and never set
`ok` for an event that was dropped. No broker runs here (the producer's bootstrap answers nothing): what
these tests check happens before Kafka is involved."""

from __future__ import annotations

from pathlib import Path

from services.inference.capture import CaptureSink
from services.inference.spool import Spool

NOWHERE = "127.0.0.1:1"


def test_a_ticket_is_set_once_the_event_is_in_the_spool_file(tmp_path: Path) -> None:
    sink = CaptureSink(NOWHERE, Spool(tmp_path)).start()
    try:
        value = b"feedback-event-" + b"x" * 64
        ticket = sink.submit("apprentice.feedback.v1", "i-1", value)
        assert ticket.wait(10)
        on_disk = b"".join(p.read_bytes() for p in tmp_path.glob("*.seg"))
        assert value in on_disk                          # a kill -9 now cannot take it with the process
        assert sink.depth == 1                           # and it waits there for the broker
    finally:
        sink.close(timeout=0.2)


def test_a_dropped_event_never_reads_as_recorded(tmp_path: Path) -> None:
    sink = CaptureSink(NOWHERE, Spool(tmp_path, max_bytes=64, segment_bytes=64)).start()
    try:
        ticket = sink.submit("apprentice.feedback.v1", "i-1", b"y" * 200)     # larger than the whole spool
        assert not ticket.wait(10)
        assert sink.dropped == 1
    finally:
        sink.close(timeout=0.2)


def test_a_full_queue_refuses_at_once(tmp_path: Path) -> None:
    sink = CaptureSink(NOWHERE, Spool(tmp_path), max_queue=1)    # not started: nothing drains the queue
    first = sink.submit("t", "k", b"1")
    second = sink.submit("t", "k", b"2")
    assert second.wait(0) is False and sink.dropped == 1
    assert first.wait(0) is False                                  # queued, not yet on disk
    sink.spool.close()
