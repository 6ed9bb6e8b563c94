"""The broker's ACL bindings of one deployment, derived from the one access table
(shared/contracts/topic_access.py): what the local broker, the Helm chart, compose and a hand-managed cluster
grant (tools/broker/acls.py applies them, tools/deploy_acls.py renders them), and what a refused client is
told to apply (shared/kafka/authorization.py).

A deployment's topics carry a prefix (`Topics(prefix)`: empty in production, one per test or private
stack); everything else it names carries the same prefix: its consumer groups (the private readers' groups
too, shared/kafka/consumers.py), transactional ids and the grader's internal topics. So the bindings are a
function of (table, prefix), and two deployments with different prefixes are granted disjoint resources:

- each contract topic, LITERAL: WRITE for its writers, READ for its readers, DESCRIBE and DESCRIBE_CONFIGS for
  every principal (topic names are no secret inside a deployment; `ensure_topics` lists them, and every
  service checks their replication at start, shared/kafka/durability.py), CREATE for `operator` (the CLI's
  `apprentice topics` creates exactly its deployment's topics, and no other);
- the cluster: IDEMPOTENT_WRITE for every writer (each producer is idempotent, shared/kafka/producer.py);
- consumer groups, PREFIXED: READ on each of a principal's group prefixes (`prefix` + name) and on its
  private readers' groups (`prefix` + `PRIVATE_GROUP_PREFIXES`); DESCRIBE on every one of those for the
  observers (dashboard, operator: the lag view lists the deployment's groups, and only those);
- the grader's own topics (faust's changelogs, join and judge topics, its leader topic) and transactional
  ids, PREFIXED `prefix` + app id: ALL on the topics (it creates them), WRITE + DESCRIBE on the ids.

The super user `admin` needs no ACL (the broker's `super.users`).
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics

CLUSTER = "kafka-cluster"
"""The name of Kafka's one cluster resource."""

RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
             "transactional_id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}
PATTERNS = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}

IMPLIES: dict[str, frozenset[str]] = {
    # what the broker also allows when it allows an operation (Kafka's AclAuthorizer / StandardAuthorizer)
    "ALL": frozenset({"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
                      "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"}),
    "READ": frozenset({"DESCRIBE"}), "WRITE": frozenset({"DESCRIBE"}), "DELETE": frozenset({"DESCRIBE"}),
    "ALTER": frozenset({"DESCRIBE"}), "ALTER_CONFIGS": frozenset({"DESCRIBE_CONFIGS"}),
}


@dataclass(frozen=True, order=True)
class Grant:
    """One ALLOW binding, in plain values (comparable, printable, independent of the client library)."""

    principal: str
    resource: str
    """"topic", "group", "transactional_id" or "cluster"."""
    name: str
    pattern: str
    """"literal" or "prefixed"."""
    operation: str
    """Kafka's operation name, upper case: READ, WRITE, CREATE, DESCRIBE, IDEMPOTENT_WRITE, ALL."""

    def binding(self) -> AclBinding:
        return AclBinding(RESOURCES[self.resource], self.name, PATTERNS[self.pattern], f"User:{self.principal}",
                          "*", AclOperation[self.operation], AclPermissionType.ALLOW)

    @classmethod
    def of(cls, b: AclBinding) -> Grant:
        principal = b.principal.removeprefix("User:")
        resource = next(k for k, v in RESOURCES.items() if v == b.restype)
        pattern = next(k for k, v in PATTERNS.items() if v == b.resource_pattern_type)
        op = b.operation
        return cls(principal, resource, b.name, pattern, op.name if isinstance(op, AclOperation) else str(op))

    def covers(self, resource: str, name: str) -> bool:
        """Whether this binding's resource pattern matches the resource `name` of kind `resource`."""
        if resource != self.resource:
            return False
        if self.pattern == "prefixed":
            return name.startswith(self.name)
        return self.name in ("*", name)

    def allows(self, principal: str, resource: str, name: str, operation: str) -> bool:
        return (principal == self.principal and self.covers(resource, name)
                and (operation == self.operation or operation in IMPLIES.get(self.operation, ())))

    def __str__(self) -> str:
        return f"{self.principal:<10} {self.operation:<16} {self.resource} {self.pattern} {self.name!r}"


def group_prefixes(who: str) -> tuple[str, ...]:
    """Every consumer group prefix of `who` before the deployment's prefix: its groups and its private
    readers' groups."""
    return access.GROUP_PREFIXES.get(who, ()) + access.PRIVATE_GROUP_PREFIXES.get(who, ())


class PrefixClash(ValueError):
    """A deployment prefix whose resources another deployment's bindings would cover (`prefix_problem`)."""


def prefix_problem(prefix: str) -> str | None:
    """Why the deployment `prefix` would share resources with the unprefixed deployment, or None. Groups and
    internal topics are granted by PREFIXED patterns (`weights`, `extractor`, ...): a deployment named
    `weights-b.` would have its groups (`weights-b.weights`) granted to the unprefixed deployment's weights."""
    if not prefix:
        return None
    taken = sorted({g for who in access.PRINCIPALS for g in group_prefixes(who)}
                   | {g for gs in access.INTERNAL_TOPIC_PREFIXES.values() for g in gs})
    clash = next((g for g in taken if prefix.startswith(g)), None)
    if clash is None:
        return None
    return (f"the topic prefix {prefix!r} starts with {clash!r}, a group or topic prefix of the unprefixed "
            "deployment's ACLs, which would then cover this deployment's resources too: choose a prefix that "
            "starts otherwise (e.g. 'staging.')")


def grants(topics: Topics | None = None) -> list[Grant]:
    """Every binding the deployment of `topics` needs (sorted, no duplicates); `PrefixClash` for a prefix whose
    resources the unprefixed deployment's bindings would cover (`prefix_problem`)."""
    topics = topics or Topics()
    p = topics.prefix
    problem = prefix_problem(p)
    if problem is not None:
        raise PrefixClash(problem)
    out: set[Grant] = set()
    for a in access.TABLE:
        name = p + a.topic
        for who in access.PRINCIPALS:
            out.add(Grant(who, "topic", name, "literal", "DESCRIBE"))
            # replication and min.insync.replicas, checked by every service at start (shared/kafka/durability.py)
            out.add(Grant(who, "topic", name, "literal", "DESCRIBE_CONFIGS"))
        for who in a.writers:
            out.add(Grant(who, "topic", name, "literal", "WRITE"))
            out.add(Grant(who, "cluster", CLUSTER, "literal", "IDEMPOTENT_WRITE"))
        for who in a.readers:
            out.add(Grant(who, "topic", name, "literal", "READ"))
        for who in access.TOPIC_CREATORS:
            out.add(Grant(who, "topic", name, "literal", "CREATE"))
    every_group: set[str] = set()
    for who in access.PRINCIPALS:
        out.update(Grant(who, "group", p + g, "prefixed", "READ") for g in group_prefixes(who))
        every_group.update(p + g for g in group_prefixes(who))
    for who in (access.DASHBOARD, access.OPERATOR):
        out.update(Grant(who, "group", g, "prefixed", "DESCRIBE") for g in every_group)
    for who, prefixes in access.INTERNAL_TOPIC_PREFIXES.items():
        for g in prefixes:
            out.add(Grant(who, "topic", p + g, "prefixed", "ALL"))
            out.add(Grant(who, "transactional_id", p + g, "prefixed", "WRITE"))
            out.add(Grant(who, "transactional_id", p + g, "prefixed", "DESCRIBE"))
            out.add(Grant(who, "cluster", CLUSTER, "literal", "IDEMPOTENT_WRITE"))
    return sorted(out)


def allowed(granted: list[Grant], principal: str, resource: str, name: str, operation: str) -> bool:
    """Whether `granted` (a deployment's `grants`) lets `principal` do `operation` on the resource `name`."""
    return any(g.allows(principal, resource, name, operation) for g in granted)
