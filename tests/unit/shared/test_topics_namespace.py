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
