"""Kafka topic names and their layout: the one place they are spelled (docs/architecture.md §3).

`Topics(prefix)` exists so that tests (and several stacks on one broker) can work in a namespace; in
production the prefix is empty and the names are exactly the contract names below.

The prefix namespaces more than topics: every consumer group id and transactional id a service uses comes
from `Topics.group_id` / `Topics.transactional_id`, so two stacks on one cluster never join each other's
groups (which would rebalance them against each other and mix their lag), nor fence each other's
transactional producers.
"""

from __future__ import annotations

from dataclasses import dataclass

INTERACTIONS = "apprentice.interactions.v1"
FEEDBACK = "apprentice.feedback.v1"
GRADED = "apprentice.graded.v1"
KNOWLEDGE = "apprentice.knowledge.v1"
CHECKPOINTS = "apprentice.checkpoints.v1"
MODEL_UPDATES = "apprentice.model-updates.v1"
DEADLETTER = "apprentice.deadletter.v1"
AUDIT = "apprentice.audit.v1"
GRADER_RULES = "apprentice.grader-rules.v1"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False
    retention_ms: int = 7 * 24 * 3600 * 1000  # a week: late feedback may come hours later; replays need days
    json_values: bool = False
    """Values are JSON documents (an operator's settings), not protobuf events with an envelope."""


# Partition counts bound how many replicas of a consumer can share the work (docs/architecture.md §3).
# The three stream topics take their count from the deployment (`Topics.stream_partitions`: 6 unless
# sized otherwise, docs/capacity.md); the others are small control streams.
STREAM_TOPICS: tuple[str, ...] = (INTERACTIONS, FEEDBACK, GRADED)
DEFAULT_STREAM_PARTITIONS = 6
SPECS: tuple[TopicSpec, ...] = (
    TopicSpec(INTERACTIONS, partitions=DEFAULT_STREAM_PARTITIONS),
    TopicSpec(FEEDBACK, partitions=DEFAULT_STREAM_PARTITIONS),
    TopicSpec(GRADED, partitions=DEFAULT_STREAM_PARTITIONS),
    TopicSpec(KNOWLEDGE, partitions=3, compacted=True, retention_ms=-1),
    TopicSpec(CHECKPOINTS, partitions=1),
    TopicSpec(MODEL_UPDATES, partitions=1),
    TopicSpec(DEADLETTER, partitions=1, retention_ms=30 * 24 * 3600 * 1000),
    # Operator actions are kept a year: who promoted, forced, rolled back or approved what.
    TopicSpec(AUDIT, partitions=1, retention_ms=365 * 24 * 3600 * 1000),
    # Grading rules set at run time (`apprentice grader rules set`), keyed <tenant>/<task>: kept for good.
    TopicSpec(GRADER_RULES, partitions=1, compacted=True, retention_ms=-1, json_values=True),
)

BASE_NAMES: tuple[str, ...] = tuple(s.name for s in SPECS)
EVENT_TOPICS: tuple[str, ...] = tuple(s.name for s in SPECS if not s.json_values)
"""The topics whose values are protobuf events (shared/contracts/events.py MESSAGE_TYPES has a type for each)."""


@dataclass(frozen=True)
class Topics:
    """The concrete topic names for one deployment (contract names with an optional prefix)."""

    prefix: str = ""
    stream_partitions: int = DEFAULT_STREAM_PARTITIONS
    """Partitions of interactions, feedback and graded when this deployment creates them: the most grader
    workers (and trainer or analytics consumers) that share their traffic (docs/capacity.md). Topics that
    exist are left as they are."""

    def __post_init__(self) -> None:
        if self.stream_partitions < 1:
            raise ValueError(f"stream_partitions must be at least 1, got {self.stream_partitions}")

    @property
    def interactions(self) -> str:
        return self.prefix + INTERACTIONS

    @property
    def feedback(self) -> str:
        return self.prefix + FEEDBACK

    @property
    def graded(self) -> str:
        return self.prefix + GRADED

    @property
    def knowledge(self) -> str:
        return self.prefix + KNOWLEDGE

    @property
    def checkpoints(self) -> str:
        return self.prefix + CHECKPOINTS

    @property
    def model_updates(self) -> str:
        return self.prefix + MODEL_UPDATES

    @property
    def deadletter(self) -> str:
        return self.prefix + DEADLETTER

    @property
    def audit(self) -> str:
        return self.prefix + AUDIT

    @property
    def grader_rules(self) -> str:
        return self.prefix + GRADER_RULES

    def group_id(self, name: str) -> str:
        """The consumer group id of `name` ("extractor", "weights", ...) in this namespace."""
        return _namespaced(self.prefix, name, "consumer group")

    def transactional_id(self, name: str) -> str:
        """The Kafka `transactional.id` of `name` in this namespace (a fenced zombie is one of ours)."""
        return _namespaced(self.prefix, name, "transactional id")

    def owns_group(self, group: str) -> bool:
        """Whether consumer group `group` belongs to this namespace (every group does without a prefix)."""
        return group.startswith(self.prefix)

    def specs(self) -> list[TopicSpec]:
        return [TopicSpec(self.prefix + s.name, self.stream_partitions if s.name in STREAM_TOPICS else s.partitions,
                          s.compacted, s.retention_ms) for s in SPECS]

    def base_of(self, name: str) -> str:
        """Contract name of a concrete topic name; raises KeyError for a topic that is not ours."""
        base = name[len(self.prefix):] if self.prefix and name.startswith(self.prefix) else name
        if base not in BASE_NAMES:
            raise KeyError(f"{name!r} is not an Apprentice topic (known: {', '.join(BASE_NAMES)})")
        return base

    def resolve(self, name: str) -> str:
        """Accept a contract name or a short alias ("graded") and return the concrete name."""
        for base in BASE_NAMES:
            short = base.split(".")[1]
            if name in (base, short, self.prefix + base):
                return self.prefix + base
        raise KeyError(f"unknown topic {name!r}; use one of: {', '.join(b.split('.')[1] for b in BASE_NAMES)}")


def _namespaced(prefix: str, name: str, what: str) -> str:
    """`prefix + name`. Callers pass the bare name (settings hold bare names), so nothing is prefixed
    twice; guessing from the name's start would misfire on a prefix such as "e" and "extractor"."""
    if not name:
        raise ValueError(f"a {what} name must not be empty")
    return prefix + name


def contract_name(name: str) -> str | None:
    """The contract name a concrete topic name ends with, whatever its deployment's prefix; None for a topic
    that is not one of ours. Record signatures bind this name (shared/kafka/signing.py), so a consumer can
    check a record without knowing the prefix its producer was configured with."""
    for base in BASE_NAMES:
        if name.endswith(base):
            return base
    return None
