from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.contracts.topics import BASE_NAMES, Topics
from shared.settings import CommonSettings


def test_contract_topic_names_and_prefix() -> None:
    assert BASE_NAMES == ("apprentice.interactions.v1", "apprentice.feedback.v1", "apprentice.graded.v1",
                          "apprentice.knowledge.v1", "apprentice.checkpoints.v1", "apprentice.model-updates.v1",
                          "apprentice.deadletter.v1", "apprentice.audit.v1", "apprentice.grader-rules.v1")
    t = Topics("ns.")
    assert t.graded == "ns.apprentice.graded.v1"
    assert t.base_of("ns.apprentice.graded.v1") == "apprentice.graded.v1"
    assert t.resolve("graded") == t.resolve("apprentice.graded.v1") == t.graded
    with pytest.raises(KeyError, match="unknown topic"):
        t.resolve("nope")
    assert [s.compacted for s in t.specs()].count(True) == 2


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", "k1:9092,k2:9092")
    monkeypatch.setenv("APPRENTICE_TOPIC_PREFIX", "x.")
    monkeypatch.setenv("APPRENTICE_MODEL", "tiny-random")
    s = CommonSettings()
    assert (s.kafka_bootstrap, s.topics.feedback, s.model) == ("k1:9092,k2:9092", "x.apprentice.feedback.v1",
                                                                "tiny-random")
    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", " ")
    with pytest.raises(ValidationError, match="APPRENTICE_KAFKA_BOOTSTRAP"):
        CommonSettings()
