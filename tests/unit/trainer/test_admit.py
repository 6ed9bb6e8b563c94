"""The trainer's one filter of graded records (`admit`, services/trainer/rollouts.py), used by the RL
buffer for records from Kafka and by `Trainer.rl_round` for records handed to it: each rule refuses what
it must and nothing else."""

from __future__ import annotations

import pytest

from services.trainer.rollouts import MALFORMED, NO_SIGNAL, OTHER_TENANT, QUARANTINED, admit
from shared.proto.apprentice.v1 import events_pb2
from tests.unit.trainer.factories import graded


def without_id() -> events_pb2.GradedInteraction:
    g = graded("x")
    g.interaction.interaction_id = ""
    return g


def inner_tenant_differs() -> events_pb2.GradedInteraction:
    g = graded("x")
    g.interaction.envelope.tenant = "globex"      # the grader's envelope says acme, the interaction globex
    return g


@pytest.mark.parametrize(("record", "reason"), [
    (lambda: graded("x", tenant="globex"), OTHER_TENANT),
    (inner_tenant_differs, OTHER_TENANT),
    (without_id, MALFORMED),
    (lambda: graded("x", quarantined=True), QUARANTINED),
    (lambda: graded("x", quarantined=True, has_signal=False), QUARANTINED),
    (lambda: graded("x", has_signal=False), NO_SIGNAL),
    (lambda: graded("x", response=()), MALFORMED),
    (lambda: graded("x", prompt=()), MALFORMED),
])
def test_refused_with_its_reason(record, reason: str) -> None:  # noqa: ANN001
    verdict = admit(record(), "acme")
    assert (verdict.rollout, verdict.reason) == (None, reason)


def test_a_usable_record_becomes_its_rollout() -> None:
    verdict = admit(graded("x", reward=0.5, group="G", group_size=4, version="v2", revision=3), "acme")
    r = verdict.rollout
    assert verdict.reason == "" and r is not None
    assert (r.interaction_id, r.tenant, r.reward, r.group_id, r.group_size, r.policy_version, r.revision) == (
        "x", "acme", 0.5, "G", 4, "v2", 3)
    assert (r.prompt_ids, r.completion_ids) == ([1, 2, 3], [4, 5])
