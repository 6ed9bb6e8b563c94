"""Consumed records --> one batch's outputs (the native runtime's per-record path, no Kafka)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from services.grader.batch import BatchGrader, Outputs
from services.grader.store import StateStore

from services.grader.core.bundles import encode_bundle, partition_for
from services.grader.core.detectors import DetectorStats
from services.grader.core.join import INTERACTION, TICK, Joiner
from shared.grading import parse_grader_config
from tests.helpers.grader import feedback, interaction

T0 = 1_800_000_000.0
P = 6
CONFIG = parse_grader_config({"version": "b-1", "tasks": [
    {"tenant": "demo", "task": "support", "feedback_window_s": 60,
     "graders": [{"name": "resolved", "type": "kpi", "kpi": "resolved", "map": {1: 1.0, 0: 0.0}}]},
    {"tenant": "demo", "task": "rules", "graders": [{"name": "num", "type": "regex", "pattern": "[0-9]+"}]},
]})


@dataclass
class Rec:
    """A consumed record (the methods confluent_kafka.Message has)."""
    t: str
    v: bytes | None
    p: int = 0
    o: int = 0
    k: bytes | None = None
    h: list[tuple[str, bytes]] | None = None

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.h


def grader(owned: range = range(P)) -> BatchGrader:
    joiner = Joiner(CONFIG, DetectorStats(CONFIG.detectors), retention_s=3600, orphan_feedback_s=600)
    store = StateStore(joiner.due)
    for p in owned:
        store.load(p, [])
    return BatchGrader(joiner, store, interactions_topic="in", join_topic="join", partitions=P)


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def test_owned_items_are_joined_at_once_and_each_state_is_written_once() -> None:
    g, out = grader(), Outputs()
    it = interaction(occurred_at=at(T0))
    g.add(Rec("in", it.SerializeToString(), k=it.session_id.encode()), out, T0)
    assert not out.graded  # waits for the KPI
    g.add(Rec("fb", feedback(it.interaction_id, value=1.0, occurred_at=at(T0 + 1)).SerializeToString()), out, T0 + 1)
    [rec] = out.graded
    assert (rec.revision, rec.reward, rec.has_signal) == (1, 1.0, True)
    p = partition_for(it.interaction_id.encode(), P)
    [(key, (part, st))] = out.states.items()
    assert key == it.interaction_id and part == p and st is not None and st.revision == 1 and len(st.feedback) == 1
    assert not out.hops and not out.dead and not out.judge


def test_items_for_partitions_owned_elsewhere_travel_bundled_then_apply_there() -> None:
    it = interaction(task="rules", text="7 days", occurred_at=at(T0))
    p = partition_for(it.interaction_id.encode(), P)
    here, out = grader(owned=range(0)), Outputs()
    here.add(Rec("in", it.SerializeToString()), out, T0)
    assert not out.graded and not out.states and list(out.hops) == [p]
    there, out2 = grader(owned=range(p, p + 1)), Outputs()
    there.add(Rec("join", encode_bundle(out.hops[p]), p=p), out2, T0)
    assert [r.interaction.interaction_id for r in out2.graded] == [it.interaction_id]


def test_rejections_become_dead_letters_and_the_batch_goes_on() -> None:
    g, out = grader(), Outputs()
    g.add(Rec("in", b"\xff junk", p=2, o=17, k=b"bad"), out, T0)
    g.add(Rec("join", b"not a bundle", p=1, o=3), out, T0)
    g.add(Rec("join", encode_bundle([(b"k", b"Xjunk")]), p=1, o=4), out, T0)
    ok = interaction(task="rules", text="1")
    g.add(Rec("in", ok.SerializeToString()), out, T0)
    stages = [(d.stage, d.origin_topic, d.origin_offset) for _, d in out.dead]
    assert stages == [("grader.decode", "in", 17), ("grader.join", "join", 3), ("grader.join", "join", 4)]
    assert out.dead[0][0] == b"bad" and len(out.graded) == 1


def test_ticks_close_windows_and_duplicates_change_nothing() -> None:
    g, out = grader(), Outputs()
    it = interaction(occurred_at=at(T0))
    for _ in range(2):
        g.add(Rec("in", it.SerializeToString()), out, T0)
    assert len(out.states) == 1
    g.tick(out, T0 + 30)
    assert not out.graded
    g.tick(out, T0 + 61)
    [rec] = out.graded
    assert (rec.has_signal, rec.no_signal_reason) == (False, "window_expired")
    later = Outputs()
    g.tick(later, T0 + 62)
    assert not later  # nothing more is due until retention ends
    g.tick(later, T0 + 61 + 3601)
    assert later.states == {it.interaction_id: (partition_for(it.interaction_id.encode(), P), None)}


def test_a_join_item_of_an_unknown_kind_in_a_bundle_is_dead_lettered_alone() -> None:
    g, out = grader(), Outputs()
    it = interaction(task="rules", text="5")
    p = partition_for(it.interaction_id.encode(), P)
    g.add(Rec("join", encode_bundle([(b"x", b"?"), (it.interaction_id.encode(), INTERACTION + it.SerializeToString()),
                                     (b"__confirmed__/1", TICK)]), p=p), out, T0)
    assert len(out.graded) == 1 and [d.stage for _, d in out.dead] == ["grader.join", "grader.join"]


def test_restored_partitions_skip_confirmation_keys_and_unreadable_states() -> None:
    from services.grader.native_runtime import _states

    from services.grader.core.state import PendingState

    good = PendingState("iid-1", partition=2, revision=1)
    table = {b"iid-1": good.encode(), b"__confirmed__/2": b'{"confirmed_seq": 5}', b"iid-2": b"GS1garbage"}
    assert list(_states(2, table)) == [("iid-1", good)]


def test_feedback_refused_at_the_join_becomes_a_dead_letter_and_the_interaction_is_graded() -> None:
    g, out = grader(), Outputs()
    it = interaction(occurred_at=at(T0))
    foreign = feedback(it.interaction_id, kind="correction", comment="x", tenant="other", occurred_at=at(T0))
    g.add(Rec("fb", foreign.SerializeToString(), o=4), out, T0)  # waits for its interaction
    g.add(Rec("in", it.SerializeToString()), out, T0)
    g.add(Rec("fb", feedback(it.interaction_id, value=1.0, occurred_at=at(T0 + 1)).SerializeToString(), o=5), out,
          T0 + 1)
    [(key, letter)] = out.dead
    assert (letter.stage, letter.original_value, key) == ("grader.tenant", foreign.SerializeToString(),
                                                          it.interaction_id.encode())
    [rec] = out.graded
    assert rec.reward == 1.0 and [f.envelope.tenant for f in rec.feedback] == ["demo"]
    assert len(out.states[it.interaction_id][1].feedback) == 1  # type: ignore[union-attr]
    assert out.blobs[it.interaction_id] == out.states[it.interaction_id][1].encode()  # type: ignore[union-attr]
