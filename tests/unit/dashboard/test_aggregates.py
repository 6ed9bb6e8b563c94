"""The dashboard's folds on hand-made records: revisions replace each other, curves split by tenant, task,
policy version and time bucket, hacking counts and examples, redelivered orders counted once."""

from __future__ import annotations

from datetime import UTC, datetime

from services.dashboard.aggregates import GradedFold, UpdatesFold, time_axis
from shared.proto.apprentice.v1 import common_pb2, events_pb2

T0 = 1_700_000_040.0
"""A bucket boundary (a multiple of 60 s and of 10 s); record times below are offsets from it."""


def graded(iid: str, *, t: float, reward: float = 0.0, success: bool = False, version: str = "base",
           tenant: str = "demo", task: str = "support", revision: int = 1, has_signal: bool = True, tokens: int = 4,
           flags: tuple[str, ...] = (), quarantined: bool = False) -> events_pb2.GradedInteraction:
    env = common_pb2.Envelope(event_id=f"{iid}-{revision}", tenant=tenant)
    env.occurred_at.FromNanoseconds(int((T0 + t + 1000) * 1e9))          # graded later than served
    it_env = common_pb2.Envelope(event_id=iid, tenant=tenant)
    it_env.occurred_at.FromNanoseconds(int((T0 + t) * 1e9))
    it = events_pb2.Interaction(envelope=it_env, interaction_id=iid, task=task, policy_version=version,
                                response_text="answer " * tokens, response_token_ids=list(range(tokens)),
                                messages=[common_pb2.ChatMessage(role="user", content=f"question {iid}")])
    return events_pb2.GradedInteraction(envelope=env, interaction=it, revision=revision, reward=reward,
                                        has_signal=has_signal, success=success, flags=list(flags),
                                        quarantined=quarantined)


def test_curves_split_by_version_and_bucket_with_highest_revision() -> None:
    fold = GradedFold(bucket_s=60)
    assert fold.add(graded("a", t=0, has_signal=False))
    assert fold.add(graded("a", t=0, reward=1.0, success=True, revision=2))     # late feedback re-grades it
    assert not fold.add(graded("a", t=0, has_signal=False, revision=1))         # redelivered old revision
    fold.add(graded("b", t=30, reward=0.0, tokens=8))
    fold.add(graded("c", t=70, reward=0.5, success=True, version="v1", tokens=2))
    fold.add(graded("d", t=75, reward=-1.0, version="v1", has_signal=False, tokens=6))
    fold.add(graded("e", t=10, reward=1.0, tenant="shop", task="returns"))

    assert fold.tenants() == {"demo": ["support"], "shop": ["returns"]}
    demo, shop = fold.curves()
    assert (demo["tenant"], demo["task"]) == ("demo", "support")
    by_version = {s["version"]: s for s in demo["series"]}
    assert set(by_version) == {"base", "v1"}
    [base_bucket] = by_version["base"]["points"]
    assert base_bucket == {"t": T0, "ms": T0 * 1000, "n": 2, "with_signal": 2, "reward": 0.5, "success": 0.5,
                           "tokens": 6.0}
    [v1_bucket] = by_version["v1"]["points"]
    # d has no signal: it counts for success and length, not for the mean reward
    assert v1_bucket == {"t": T0 + 60, "ms": (T0 + 60) * 1000, "n": 2, "with_signal": 1, "reward": 0.5,
                         "success": 0.5, "tokens": 4.0}
    assert shop["series"][0]["points"][0]["reward"] == 1.0
    assert [c["tenant"] for c in fold.curves("shop")] == ["shop"]
    assert fold.records == 7


def test_bucket_without_signal_has_no_reward() -> None:
    fold = GradedFold(bucket_s=10)
    fold.add(graded("x", t=5, has_signal=False))
    [curve] = fold.curves()
    assert curve["series"][0]["points"][0]["reward"] is None


def test_hacking_counts_flags_and_keeps_newest_examples() -> None:
    fold = GradedFold(bucket_s=60, examples=2)
    fold.add(graded("a", t=0, flags=("length_exploit",), quarantined=True))
    fold.add(graded("b", t=10))
    fold.add(graded("c", t=70, flags=("length_exploit", "judge_kpi_disagreement")))
    fold.add(graded("d", t=80, flags=("judge_kpi_disagreement",)))
    fold.add(graded("d", t=80, flags=("judge_kpi_disagreement",), quarantined=True, revision=2))
    [demo] = fold.hacking()
    assert (demo["interactions"], demo["flagged"], demo["quarantined"]) == (4, 3, 2)
    assert demo["flags"] == {"judge_kpi_disagreement": 2, "length_exploit": 2}
    assert demo["points"] == [{"t": T0, "ms": T0 * 1000, "n": 2, "flagged": 1, "quarantined": 1},
                              {"t": T0 + 60, "ms": (T0 + 60) * 1000, "n": 2, "flagged": 2, "quarantined": 1}]
    # newest first, two kept, and d's second revision replaced its first
    assert [(e["interaction_id"], e["quarantined"]) for e in demo["examples"]] == [("d", True), ("c", False)]
    assert demo["examples"][0]["prompt"] == "question d"


def test_memory_bound_evicts_oldest() -> None:
    fold = GradedFold(bucket_s=60, max_interactions=2)
    for i, t in enumerate((0, 1, 2)):
        fold.add(graded(f"i{i}", t=t))
    [curve] = fold.curves()
    assert curve["series"][0]["n"] == 2


def test_updates_fold_counts_each_order_once() -> None:
    fold = UpdatesFold()
    env = common_pb2.Envelope(event_id="o1", principal=common_pb2.Principal(key_id="alice", role="operator"))
    order = events_pb2.ModelUpdate(envelope=env, model="m", action=events_pb2.UPDATE_ACTION_CANARY, version="v2",
                                   canary_fraction=0.25, previous_version="v1")
    assert fold.add(order) and not fold.add(order)
    [o] = fold.timeline("m")
    assert (o["action"], o["version"], o["fraction"], o["by"]) == ("canary", "v2", 0.25, "alice")
    assert fold.timeline("other") == []


def test_time_axis_spans_minutes_around_zero_one_or_many_buckets() -> None:
    # one bucket: a bucket either side of it (Chart.js would widen a zero-width range by 5% of the value:
    # years, for seconds or ms since the epoch), in ms since the epoch, the point in the middle
    one = time_axis([T0], 60)
    assert one == {"min": (T0 - 60) * 1000, "max": (T0 + 60) * 1000, "step": 15_000, "bucket": 60_000}
    # many: half a bucket beyond the first and last, ticks on whole minutes / hours
    many = time_axis([T0 + 120, T0, T0 + 60], 60)
    assert (many["min"], many["max"]) == ((T0 - 30) * 1000, (T0 + 150) * 1000)
    assert many["step"] == 30_000
    day = time_axis([T0 + 3600 * h for h in range(24)], 3600)
    assert day["step"] == 3 * 3600_000 and (day["max"] - day["min"]) == 24 * 3600_000
    weeks = time_axis([T0, T0 + 30 * 86400], 3600)
    assert weeks["step"] % 86_400_000 == 0 and (weeks["max"] - weeks["min"]) / weeks["step"] <= 8
    # none: the current bucket
    assert time_axis([], 10, now=T0 + 7) == {"min": (T0 - 10) * 1000, "max": (T0 + 10) * 1000, "step": 5000,
                                             "bucket": 10_000}


def test_chart_points_are_utc_epoch_ms_with_their_axis() -> None:
    fold = GradedFold(bucket_s=10)
    fold.add(graded("a", t=3, reward=1.0, flags=("length_exploit",)))
    [curve] = fold.curves()
    [point] = curve["series"][0]["points"]
    # the bucket start as the browser's Date takes it: the same instant as the envelope's UTC time
    assert datetime.fromtimestamp(point["ms"] / 1000, UTC) == datetime.fromtimestamp(T0, UTC)
    assert curve["axis"]["min"] < point["ms"] < curve["axis"]["max"]
    assert curve["axis"]["max"] - curve["axis"]["min"] == 20_000           # two buckets, not years
    [tenant] = fold.hacking()
    assert tenant["axis"] == curve["axis"] and tenant["points"][0]["ms"] == point["ms"]
