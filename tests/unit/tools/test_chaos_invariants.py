"""The chaos run's invariant checks fail when they should: hand-built topic records (real protobuf
events in a minimal record wrapper) with one planted duplicate, loss or double training each."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from load.loadgen import Attempt, Served
from shared.contracts.events import deterministic_id, make_envelope
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.chaos_invariants import (
    Figure,
    Window,
    check_feedback,
    check_graded,
    check_interactions,
    check_requests,
    check_training,
    swap_windows,
)


@dataclass
class Record:
    """What the checks read from a consumed Kafka message: its value and its broker timestamp."""
    payload: bytes
    ts_ms: int = 0

    def value(self) -> bytes:
        return self.payload

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts_ms)


def figure(figures: list[Figure], name: str) -> Figure:
    return next(f for f in figures if f.name.startswith(name))


def interaction(iid: str, tenant: str = "acme", event_id: str | None = None) -> Record:
    it = events_pb2.Interaction(envelope=make_envelope(tenant, source="t", event_id=event_id or
                                                       deterministic_id("interaction", iid)), interaction_id=iid)
    return Record(it.SerializeToString())


def graded(iid: str, revision: int, reward: float, feedback_ids: tuple[str, ...] = ()) -> Record:
    g = events_pb2.GradedInteraction(
        envelope=make_envelope("acme", source="t", event_id=deterministic_id("graded", iid, str(revision))),
        interaction=events_pb2.Interaction(interaction_id=iid), revision=revision, reward=reward, has_signal=True,
        feedback=[events_pb2.FeedbackEvent(envelope=make_envelope("acme", source="t", event_id=f), interaction_id=iid)
                  for f in feedback_ids])
    return Record(g.SerializeToString())


def test_interactions_duplicate_delivery_is_reported_duplicate_effect_and_loss_fail() -> None:
    served = {"a": Served("a", "acme", "base", 0.0), "b": Served("b", "acme", "base", 0.0)}
    clean = check_interactions(served, [interaction("a"), interaction("b")], strict_delivery=False)
    assert all(f.ok is not False for f in clean)
    redelivered = check_interactions(served, [interaction("a"), interaction("a"), interaction("b")], strict_delivery=False)
    assert figure(redelivered, "extra copies").value == 1 and all(f.ok is not False for f in redelivered)
    assert figure(check_interactions(served, [interaction("a"), interaction("a"), interaction("b")],
                                     strict_delivery=True), "extra copies").ok is False
    twice = check_interactions(served, [interaction("a"), interaction("a", event_id="other"), interaction("b")],
                               strict_delivery=False)
    assert figure(twice, "interaction ids with >1 event id").ok is False
    lost = check_interactions(served, [interaction("a")], strict_delivery=False)
    assert figure(lost, "received answers missing").value == 1 and figure(lost, "received answers missing").ok is False


def test_feedback_acknowledged_but_missing_fails() -> None:
    served = {"a": Served("a", "acme", "base", 0.0, feedback_ids=["f1", "f2"])}
    fb = events_pb2.FeedbackEvent(envelope=make_envelope("acme", source="t", event_id="f1"), interaction_id="a")
    figs = check_feedback(served, [Record(fb.SerializeToString())], strict_delivery=False)
    assert figure(figs, "acknowledged events missing").value == 1 and figure(figs, "acknowledged events missing").ok is False


def test_graded_revisions_repeats_gaps_and_lost_feedback() -> None:
    served = {"a": Served("a", "acme", "base", 0.0, feedback_ids=["k"]),
              "b": Served("b", "acme", "base", 0.0, feedback_ids=["k2", "t2"])}
    good = [graded("a", 1, 0.0, ("k",)), graded("b", 1, 0.0, ("k2",)), graded("b", 2, 0.5, ("k2", "t2"))]
    assert all(f.ok is not False for f in check_graded(served, good, strict_delivery=False))
    assert figure(check_graded(served, good, strict_delivery=False), "interactions with a revision >= 2").value == 1
    # the same revision delivered twice (same id, same content): a delivery, not an effect
    again = check_graded(served, [*good, graded("a", 1, 0.0, ("k",))], strict_delivery=False)
    assert figure(again, "extra copies of one revision").value == 1 and all(f.ok is not False for f in again)
    # the same revision with other content: two effects
    clash = check_graded(served, [*good, graded("a", 1, 1.0, ("k",))], strict_delivery=False)
    assert figure(clash, "(interaction, revision) with >1").ok is False
    # revision 2 repeating revision 1's content: an effect emitted twice
    repeat = check_graded(served, [*good, graded("a", 2, 0.0, ("k",))], strict_delivery=False)
    assert figure(repeat, "revisions repeating").ok is False
    gap = check_graded(served, [graded("a", 1, 0.0, ("k",)), graded("b", 2, 0.5, ("k2", "t2"))], strict_delivery=False)
    assert figure(gap, "interactions with a missing revision").ok is False
    lost = check_graded(served, [graded("a", 1, 0.0, ("k",)), graded("b", 1, 0.0, ("k2",))], strict_delivery=False)
    assert figure(lost, "acknowledged feedback missing").value == 1
    ungraded = check_graded(served, [graded("a", 1, 0.0, ("k",))], strict_delivery=False)
    assert figure(ungraded, "received answers never graded").ok is False


def _checkpoint(root: Path, ckpt_id: str, trained: list[str]) -> None:
    (root / "ckpts" / ckpt_id).mkdir(parents=True)
    (root / "ckpts" / ckpt_id / "state.json").write_text(json.dumps({"trained_ids": trained}))


def test_training_an_interaction_in_two_versions_fails(tmp_path: Path) -> None:
    from shared.proto.apprentice.v1 import weights_pb2

    _checkpoint(tmp_path, "ckpt-1", ["a", "b"])
    _checkpoint(tmp_path, "ckpt-2", ["c"])
    (tmp_path / "published.json").write_text(json.dumps({"ckpt-1": {"version": "v1"}, "ckpt-2": {"version": "v2"}}))
    manifests = [weights_pb2.Manifest(version=v, tenant="acme", training_metadata={"checkpoint_id": c})
                 for v, c in (("v1", "ckpt-1"), ("v2", "ckpt-2"))]
    announced = [Record(events_pb2.CheckpointPublished(version=v, tenant="acme").SerializeToString()) for v in ("v1", "v2")]
    its = [interaction(i) for i in "abc"] + [interaction("z", tenant="globex")]
    ok = check_training("acme", tmp_path, its, announced, manifests, min_versions=1)
    assert all(f.ok is not False for f in ok) and figure(ok, "interactions trained").value == 3

    (tmp_path / "ckpts" / "ckpt-2" / "state.json").write_text(json.dumps({"trained_ids": ["c", "b", "z"]}))
    bad = check_training("acme", tmp_path, its, announced, manifests, min_versions=1)
    assert figure(bad, "interactions trained twice").value == 1            # b in v1 and v2
    assert figure(bad, "trained ids that are not this tenant").value == 1  # z belongs to globex
    # a version whose checkpoint is gone cannot be vouched for
    untraceable = [*manifests, weights_pb2.Manifest(version="v3", tenant="acme",
                                                    training_metadata={"checkpoint_id": "ckpt-9"})]
    assert figure(check_training("acme", tmp_path, its, announced, untraceable, min_versions=1),
                  "versions not traceable").ok is False


def test_requests_failing_during_a_swap_fail_while_inference_kills_are_expected() -> None:
    oks = [Attempt("generate", "acme", 0.0, 1.0, "OK", "base"), Attempt("generate", "acme", 5.0, 6.0, "OK", "v1")]
    update = events_pb2.ModelUpdate(version="v1", tenant="acme", action=events_pb2.UPDATE_ACTION_PROMOTE,
                                    envelope=make_envelope("acme", source="t"))
    swaps = swap_windows([Record(update.SerializeToString(), ts_ms=4000)], oks, ["acme"])
    assert any(w.start <= 4.0 and w.end >= 6.0 for w in swaps)
    killed = [Window("kill", "inference", 10.0, 12.0)]
    during_kill = [*oks, Attempt("generate", "acme", 11.0, 11.5, "UNAVAILABLE")]
    figs = check_requests(during_kill, Counter(), killed, swaps, min_swaps=1)
    assert all(f.ok is not False for f in figs)
    assert figure(figs, "failed generate calls: inference killed").value == 1
    during_swap = [*oks, Attempt("generate", "acme", 4.5, 5.5, "UNAVAILABLE")]
    assert figure(check_requests(during_swap, Counter(), killed, swaps, min_swaps=1),
                  "failed generate calls: during a swap").ok is False
    no_fault = [*oks, Attempt("feedback", "acme", 30.0, 31.0, "INTERNAL")]
    assert figure(check_requests(no_fault, Counter(), killed, swaps, min_swaps=1),
                  "failed feedback calls: no fault").ok is False
    assert figure(check_requests(oks, Counter({"generate": 1}), killed, swaps, min_swaps=1),
                  "calls failed for good").ok is False
    assert figure(check_requests(oks, Counter(), killed, [], min_swaps=1), "weight swaps seen").ok is False
