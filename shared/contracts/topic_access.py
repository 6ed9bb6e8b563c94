"""Who may write and read each topic, and which consumer groups each principal owns: the one table that
the broker's ACLs (tools/broker/acls.py) and the record signatures (shared/kafka/signing.py) both follow.

A principal is a service identity, the same name on the broker (its SASL user) and on its records (the
signer): `inference` writes interactions and feedback, and nobody else may; a graded record is only ever
written by `grader`. SECURITY.md prints this table; a test keeps the two in step.

Why both ACLs and signatures: the broker's ACLs stop anyone without the right credentials from writing a
topic at all; the signature on every record lets each consumer check, record by record, that the principal
allowed to produce that record type wrote it (a stolen analytics password, a misconfigured ACL, a record
copied from one topic to another, or a broker-level compromise still cannot forge a graded record).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.contracts import topics as t

INFERENCE = "inference"
GRADER = "grader"
EXTRACTOR = "extractor"
TRAINER = "trainer"
WEIGHTS = "weights"
DASHBOARD = "dashboard"
OPERATOR = "operator"
"""The operator's tools (`apprentice grader rules set`, `apprentice tail`, `apprentice topics`)."""
ANALYTICS = "analytics"
"""Read-only consumers outside the loop (a product team's analytics jobs)."""
ADMIN = "admin"
"""Broker administration only (creating topics, users and ACLs): a super user on the broker, never a
record signer, never configured in a service."""

SERVICES: tuple[str, ...] = (INFERENCE, GRADER, EXTRACTOR, TRAINER, WEIGHTS, DASHBOARD)
PRINCIPALS: tuple[str, ...] = (*SERVICES, OPERATOR, ANALYTICS)
"""Every principal that gets its own broker credentials (ADMIN apart)."""


@dataclass(frozen=True)
class TopicAccess:
    topic: str
    """Contract (base) name, see shared/contracts/topics.py."""
    writers: frozenset[str]
    """Who may produce to it: the broker's WRITE ACL, and the only signers a consumer accepts there."""
    readers: frozenset[str]


def _access(topic: str, writers: tuple[str, ...], readers: tuple[str, ...]) -> TopicAccess:
    return TopicAccess(topic, frozenset(writers), frozenset(readers))


_OBSERVERS = (DASHBOARD, OPERATOR)

TABLE: tuple[TopicAccess, ...] = (
    _access(t.INTERACTIONS, (INFERENCE,), (GRADER, *_OBSERVERS, ANALYTICS)),
    _access(t.FEEDBACK, (INFERENCE,), (GRADER, *_OBSERVERS, ANALYTICS)),
    # the grader reads its own output back after a restart: an emission in doubt (a kill between its state
    # write and its confirmation) is looked for there before it is sent again (services/grader/stream/recovery.py)
    _access(t.GRADED, (GRADER,), (GRADER, TRAINER, EXTRACTOR, *_OBSERVERS, ANALYTICS)),
    _access(t.KNOWLEDGE, (EXTRACTOR,), (EXTRACTOR, INFERENCE, TRAINER, WEIGHTS, *_OBSERVERS)),
    _access(t.CHECKPOINTS, (TRAINER,), (WEIGHTS, *_OBSERVERS)),
    _access(t.MODEL_UPDATES, (WEIGHTS,), (INFERENCE, EXTRACTOR, *_OBSERVERS)),
    # Every consumer dead-letters what it refuses; the dead letter says which consumer refused what, and
    # is never input to the loop.
    # Inference dead-letters the model updates and knowledge snapshots it refuses for who wrote them (a
    # forged order is an attack to be seen: services/inference/hotswap.py, services/inference/knowledge.py).
    _access(t.DEADLETTER, (INFERENCE, GRADER, EXTRACTOR, TRAINER, WEIGHTS), _OBSERVERS),
    _access(t.AUDIT, (WEIGHTS, EXTRACTOR), _OBSERVERS),
    _access(t.GRADER_RULES, (OPERATOR,), (GRADER, *_OBSERVERS)),
)
BY_TOPIC: dict[str, TopicAccess] = {a.topic: a for a in TABLE}

GROUP_PREFIXES: dict[str, tuple[str, ...]] = {
    # consumer group ids (before the deployment's topic prefix) each principal may use, as prefixes:
    # the defaults of each service's settings (docs/settings.md); a deployment that renames a group
    # renames it here too
    INFERENCE: ("inference-",),
    GRADER: ("apprentice-grader",),
    EXTRACTOR: ("extractor",),
    TRAINER: ("apprentice-trainer-",),
    WEIGHTS: ("weights",),
    DASHBOARD: ("dashboard-",),
    OPERATOR: ("operator-",),
    ANALYTICS: ("analytics-",),
}

PRIVATE_GROUP_PREFIXES: dict[str, tuple[str, ...]] = {
    # the throw-away groups of readers that assign partitions themselves and commit nothing
    # (shared/kafka/consumers.py `private_group`: "<prefix><purpose>-<uuid>"), and the status probe's group
    # (shared/kafka/lag.py PROBE_GROUP); after the deployment's prefix, as every group
    GRADER: ("grader-",),                               # grader-verify (stream/event_scan.py)
    EXTRACTOR: ("extractor-",),                         # extractor-rebuild (snapshots.py)
    DASHBOARD: ("apprentice-status-probe",),            # the lag view (shared/kafka/lag.py)
    OPERATOR: ("apprentice-tail-", "apprentice-cli-rules-", "apprentice-status-probe"),
}

TOPIC_CREATORS: tuple[str, ...] = (OPERATOR,)
"""Who may create the contract topics of their deployment (`apprentice topics`; `admin` may anyway): no
service, so a service started before its topics exist stops and says to run `apprentice topics`."""

INTERNAL_TOPIC_PREFIXES: dict[str, tuple[str, ...]] = {
    # topics a principal creates and owns itself (faust's changelogs, repartition and leader topics are
    # named after the grader's app id); also its transactional ids
    GRADER: ("apprentice-grader",),
}


def writers_of(topic_base: str) -> frozenset[str]:
    """The principals allowed to produce to `topic_base` (a contract name); KeyError for other topics."""
    return BY_TOPIC[topic_base].writers


def readers_of(topic_base: str) -> frozenset[str]:
    return BY_TOPIC[topic_base].readers


def writes(principal: str) -> list[str]:
    """The contract topics `principal` may produce to."""
    return [a.topic for a in TABLE if principal in a.writers]


def reads(principal: str) -> list[str]:
    return [a.topic for a in TABLE if principal in a.readers]
