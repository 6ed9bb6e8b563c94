"""Emission recovery (stream/recovery.py) against a fake stage context (stream/context.py), no Kafka: which
restored states are in doubt, what is re-emitted, and what is skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.grader.core.detectors import DetectorStats
from services.grader.core.join import INTERACTION, Joiner, graded_event_id
from services.grader.core.state import PendingState, decode_seq, encode_seq, seq_key
from services.grader.core.waiting import WaitingIndex
from services.grader.stream import recovery as R
from services.grader.stream.context import StageContext
from shared.grading import parse_grader_config
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import interaction

T0 = 1_800_000_000.0
CONFIG = parse_grader_config({"version": "r-1", "tasks": [
    {"tenant": "demo", "task": "rules", "graders": [{"name": "num", "type": "regex", "pattern": "[0-9]+"}]}]})


class FakeContext:
    """The members of StageContext that recovery uses: the table's data, the joiner, the due indexes,
    and a `send` that records what would go to Kafka."""

    def __init__(self) -> None:
        self.joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
        self.table = SimpleNamespace(data={})
        self.due: dict[bytes, tuple[float, bool, int]] = {}
        self.waiting = WaitingIndex()
        self.settings = SimpleNamespace(verify_margin_s=5.0, common=SimpleNamespace(kafka_bootstrap="unused:1",
                                                                                record_signatures="off"))
        self.topic_names = {"graded": "graded", "deadletter": "dead"}
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None]] = []

    def changelog_name(self, table: Any) -> str:
        return "changelog"

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
                   headers: Any = None) -> Awaitable[Any]:
        self.sent.append((topic, key, value, partition))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def emitted_state(text: str, partition: int, seq: int) -> PendingState:
    """The state a grade batch wrote for an interaction it emitted, with its emission marker."""
    it = interaction(task="rules", text=text, occurred_at=datetime.fromtimestamp(T0, UTC))
    joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
    step = joiner.apply(None, it.interaction_id, INTERACTION + it.SerializeToString(), T0, partition=partition)
    assert step.emit is not None and step.state is not None and step.state.revision == 1
    step.state.pending_seq, step.state.pending_ts = seq, T0
    return step.state


def settle(ctx: FakeContext, parts: set[int], found: set[str], monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    asked: list[set[str]] = []

    def find_event_ids(bootstrap: str, topic: str, wanted: set[str], since: float, **_kw: Any) -> set[str]:
        asked.append(set(wanted))
        assert topic == "graded" and since == T0 - 5.0
        return wanted & found

    monkeypatch.setattr(R, "find_event_ids", find_event_ids)
    asyncio.run(R.EmissionRecovery(cast(StageContext, ctx)).settle(parts))
    return asked


def test_in_doubt_emissions_missing_from_the_graded_topic_are_re_emitted_and_the_partition_confirmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = FakeContext()
    confirmed = emitted_state("1", partition=2, seq=100)   # its batch confirmed (seq 100 <= 150)
    lost = emitted_state("2", partition=2, seq=200)        # emitted or not: in doubt, and not in the topic
    arrived = emitted_state("3", partition=2, seq=200)     # in doubt, but its record reached the topic
    elsewhere = emitted_state("4", partition=5, seq=900)   # a partition not being settled
    data = ctx.table.data
    data[seq_key(2).encode()] = encode_seq(150)
    for st in (confirmed, lost, arrived, elsewhere):
        data[st.interaction_id.encode()] = st.encode()
    asked = settle(ctx, {2}, {graded_event_id(arrived.interaction_id, 1)}, monkeypatch)

    assert asked == [{graded_event_id(lost.interaction_id, 1), graded_event_id(arrived.interaction_id, 1)}]
    graded = [events_pb2.GradedInteraction.FromString(v or b"") for t, _k, v, _p in ctx.sent if t == "graded"]
    assert [g.envelope.event_id for g in graded] == [graded_event_id(lost.interaction_id, 1)]
    [(_, key, value, partition)] = [s for s in ctx.sent if s[0] == "changelog"]
    assert key == seq_key(2).encode() and partition == 2 and decode_seq(value) > 200  # confirmed above the marker
    assert set(ctx.due) == {st.interaction_id.encode() for st in (confirmed, lost, arrived)}


def test_confirmation_keys_and_unreadable_states_are_skipped_and_nothing_in_doubt_sends_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = FakeContext()
    good = emitted_state("7", partition=1, seq=10)
    data = ctx.table.data
    data[seq_key(1).encode()] = encode_seq(10)
    data[good.interaction_id.encode()] = good.encode()
    data[b"iid-garbage"] = b"GS1garbage"
    assert settle(ctx, {1}, set(), monkeypatch) == []   # nothing in doubt: the graded topic is not read
    assert ctx.sent == [] and list(ctx.due) == [good.interaction_id.encode()]
