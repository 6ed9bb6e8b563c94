"""Every consumer group id and transactional id carries the stack's topic prefix (shared/contracts/topics.py), so two
stacks on one cluster never share a group or fence each other's producers."""

from __future__ import annotations

import pytest

from services.extractor.settings import ExtractorSettings
from services.grader.settings import GraderSettings
from services.trainer.settings import TrainerSettings
from shared.contracts.topics import Topics


def test_group_and_transactional_ids_carry_the_prefix() -> None:
    t = Topics("stack-a.")
    assert t.group_id("extractor") == "stack-a.extractor"
    assert t.transactional_id("apprentice-grader-host-0") == "stack-a.apprentice-grader-host-0"
    assert t.owns_group("stack-a.weights") and not t.owns_group("stack-b.weights")


def test_without_a_prefix_the_names_are_unchanged() -> None:
    t = Topics()
    assert t.group_id("weights") == "weights" and t.transactional_id("x") == "x" and t.owns_group("anything")


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ValueError, match="consumer group"):
        Topics("p.").group_id("")
    with pytest.raises(ValueError, match="transactional id"):
        Topics("p.").transactional_id("")


def test_services_name_their_groups_in_the_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "stack-b.")
    assert GraderSettings().app_id == "stack-b.apprentice-grader"
    assert TrainerSettings(tenant="shop").resolved_group_id == "stack-b.apprentice-trainer-shop"
    assert TrainerSettings(group_id="mine").resolved_group_id == "stack-b.mine"
    ext = ExtractorSettings()
    assert ext.common.topics.group_id(ext.group_id) == "stack-b.extractor"


def test_the_stream_topics_take_the_deployments_partition_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """APPRENTICE_STREAM_PARTITIONS sizes interactions, feedback and graded (docs/capacity.md) and, unless the
    grader's own setting says otherwise, the grader's join; the control topics keep theirs."""
    monkeypatch.setenv("APPRENTICE_STREAM_PARTITIONS", "24")
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "big.")
    from shared.settings import CommonSettings

    specs = {s.name: s.partitions for s in CommonSettings().topics.specs()}
    assert {n: p for n, p in specs.items() if p == 24} == dict.fromkeys(
        ["big.apprentice.interactions.v1", "big.apprentice.feedback.v1", "big.apprentice.graded.v1"], 24)
    assert specs["big.apprentice.knowledge.v1"] == 3 and specs["big.apprentice.model-updates.v1"] == 1
    assert GraderSettings().join_partitions == 24
    assert GraderSettings(partitions=12).join_partitions == 12
    assert {s.partitions for s in Topics("x.").specs() if "interactions" in s.name} == {6}
    with pytest.raises(ValueError, match="at least 1"):
        Topics("x.", stream_partitions=0)
