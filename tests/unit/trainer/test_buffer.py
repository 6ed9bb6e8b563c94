"""RL buffer: tenant isolation, masking, revisions, at-most-once, staleness, groups, persistence."""

from __future__ import annotations

from services.trainer.buffer import ACCEPTED, RolloutBuffer
from tests.unit.trainer.factories import graded


def ids(rs) -> list[str]:  # noqa: ANN001
    return [r.interaction_id for r in rs]


def test_filters_and_counts() -> None:
    b = RolloutBuffer("acme", max_staleness=2)
    assert b.offer(graded("a"), 0) == ACCEPTED
    assert b.offer(graded("b", tenant="globex"), 0) == "other_tenant"
    assert b.offer(graded("c", has_signal=False), 0) == "no_signal"
    assert b.offer(graded("d", quarantined=True), 0) == "quarantined"
    assert b.offer(graded("e", response=()), 0) == "malformed"
    assert b.offer(graded("f", version="v9"), 0) == "unknown_version"
    assert ids(b.ready(0)) == ["a"]
    assert dict(b.skipped) == {"other_tenant": 1, "no_signal": 1, "quarantined": 1, "malformed": 1,
                               "unknown_version": 1}


def test_interaction_envelope_of_other_tenant_is_rejected() -> None:
    g = graded("x", tenant="acme")
    g.interaction.envelope.tenant = "globex"          # inconsistent record: never train it for acme
    assert RolloutBuffer("acme").offer(g, 0) == "other_tenant"


def test_highest_revision_replaces_pending_and_can_revoke() -> None:
    b = RolloutBuffer("acme")
    b.offer(graded("a", reward=0.0, revision=1), 0)
    b.offer(graded("a", reward=1.0, revision=2), 0)
    assert [r.reward for r in b.ready(0)] == [1.0]
    assert b.offer(graded("a", reward=0.5, revision=1), 0) == "older_revision"
    b.offer(graded("a", revision=3, quarantined=True), 0)
    assert b.ready(0) == [] and b.skipped["revoked"] == 1


def test_each_interaction_trained_at_most_once() -> None:
    b = RolloutBuffer("acme")
    b.offer(graded("a"), 0)
    b.take(b.ready(0))
    assert b.offer(graded("a", revision=2, reward=-1.0), 0) == "already_trained"
    assert b.ready(0) == []


def test_staleness_drop_at_intake_and_when_lineage_advances() -> None:
    b = RolloutBuffer("acme", max_staleness=1)
    b.advance("v1")
    b.advance("v2")
    assert b.staleness("v2") == 0 and b.staleness("base") == 2
    assert b.offer(graded("old", version="base"), 0) == "stale"
    assert b.offer(graded("ok", version="v1"), 0) == ACCEPTED
    b.advance("v3")                                   # v1 is now 2 versions old
    assert b.ready(0) == [] and b.skipped["stale"] == 2


def test_trained_ids_are_forgotten_once_they_could_only_be_stale() -> None:
    b = RolloutBuffer("acme", max_staleness=1)
    b.offer(graded("a"), 0)
    b.take(b.ready(0))
    b.advance("v1")
    assert "a" in b.trained
    b.advance("v2")
    assert "a" not in b.trained
    assert b.offer(graded("a", revision=2), 0) == "stale"


def test_group_released_when_complete_or_after_wait() -> None:
    b = RolloutBuffer("acme", group_wait_s=10)
    b.offer(graded("g1", group="G", group_size=3), 0)
    b.offer(graded("g2", group="G", group_size=3), 0)
    b.offer(graded("s"), 0)
    assert ids(b.ready(1)) == ["s"]
    b.offer(graded("g3", group="G", group_size=3, has_signal=False), 2)   # the last sibling has no signal
    assert sorted(ids(b.ready(2))) == ["g1", "g2", "s"]
    b.offer(graded("h1", group="H", group_size=2), 0)
    assert "h1" not in ids(b.ready(5))
    assert "h1" in ids(b.ready(11))                                    # sibling never came


def test_state_round_trip() -> None:
    b = RolloutBuffer("acme")
    b.advance("v1")
    b.offer(graded("a", version="v1", group="G", group_size=2), 5.0, partition=3, offset=17)
    b.offer(graded("t"), 5.0)
    b.take([r for r in b.ready(5.0) if r.interaction_id == "t"])
    c = RolloutBuffer("acme")
    c.load_state(b.to_state())
    assert c.lineage == ["base", "v1"] and "t" in c.trained
    assert c.pending["a"].offset == 17 and c.groups["G"].seen == {"a"}
    assert c.pending["a"].rollout.completion_ids == [4, 5]


def test_a_newer_revision_that_may_not_train_withdraws_the_pending_one() -> None:
    b = RolloutBuffer("acme")
    for reason, newer in (("no_signal", graded("a", revision=2, has_signal=False)),
                          ("malformed", graded("b", revision=2, response=()))):
        iid = newer.interaction.interaction_id
        assert b.offer(graded(iid), 0) == ACCEPTED
        assert b.offer(newer, 0) == reason
    assert b.ready(0) == [] and b.skipped["revoked"] == 2


def test_a_malformed_sibling_still_completes_its_group() -> None:
    """An answer redacted at capture has no tokens (malformed): its siblings need not wait for it."""
    b = RolloutBuffer("acme", group_wait_s=100)
    b.offer(graded("g1", group="G", group_size=2), 0)
    assert b.ready(1) == []
    assert b.offer(graded("g2", group="G", group_size=2, response=()), 1) == "malformed"
    assert ids(b.ready(1)) == ["g1"]
