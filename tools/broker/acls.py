"""The broker's ACLs and SCRAM users, derived from the one access table (shared/contracts/topic_access.py).

A deployment's topics carry a prefix (`Topics(prefix)`: empty in production, one per test or private
stack); its consumer groups, transactional ids and the grader's internal topics carry the same prefix. So
the bindings are a function of (table, prefix):

- each contract topic, LITERAL: WRITE for its writers, READ for its readers, DESCRIBE for every principal
  (topic names are no secret inside a deployment, and `ensure_topics` in the weights and extractor services
  lists them at start: a topic it cannot see reads as missing, and creating it would need CREATE);
- the cluster: IDEMPOTENT_WRITE for every writer (each producer is idempotent, shared/kafka/producer.py);
- consumer groups, PREFIXED: READ on each of a principal's group prefixes (`prefix` + name), and on its
  private readers' groups, which are not namespaced (`PRIVATE_GROUP_PREFIXES`); DESCRIBE on every group of
  the deployment for the observers (dashboard, operator: the lag view lists the groups);
- the grader's own topics (faust's changelogs, join and judge topics, its leader topic) and transactional
  ids, PREFIXED `prefix` + app id: ALL on the topics (it creates them), WRITE + DESCRIBE on the ids.

The super user `admin` needs no ACL (the broker's `super.users`). Nothing here grants CREATE on a contract
topic: only `admin` creates them (`apprentice kafka start`, `apprentice topics` run by an operator who holds
the admin credentials).

`apply_acls` creates what is missing and nothing else (applying twice creates nothing); `describe_acls`
reads back what the broker holds for a deployment. `ensure_scram_users` gives every principal its SCRAM
credential (generated passwords, tools/broker/local_broker.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics

CLUSTER = "kafka-cluster"
"""The name of Kafka's one cluster resource."""
ANONYMOUS = "ANONYMOUS"
"""The principal of a client on a PLAINTEXT listener (no authentication)."""


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
    """Kafka's operation name, upper case: READ, WRITE, DESCRIBE, IDEMPOTENT_WRITE, ALL."""

    def binding(self) -> AclBinding:
        return AclBinding(_RESOURCES[self.resource], self.name, _PATTERNS[self.pattern], f"User:{self.principal}",
                          "*", AclOperation[self.operation], AclPermissionType.ALLOW)

    @classmethod
    def of(cls, b: AclBinding) -> Grant:
        principal = b.principal.removeprefix("User:")
        resource = next(k for k, v in _RESOURCES.items() if v == b.restype)
        pattern = next(k for k, v in _PATTERNS.items() if v == b.resource_pattern_type)
        op = b.operation
        return cls(principal, resource, b.name, pattern, op.name if isinstance(op, AclOperation) else str(op))

    def __str__(self) -> str:
        return f"{self.principal:<10} {self.operation:<16} {self.resource} {self.pattern} {self.name!r}"


_RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
              "transactional_id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}
_PATTERNS = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}


def _every(prefix: str) -> tuple[str, str]:
    """(name, pattern) naming every resource of a deployment: PREFIXED `prefix`, or LITERAL "*" (Kafka's
    wildcard) when the deployment has no prefix (a PREFIXED pattern cannot be empty)."""
    return (prefix, "prefixed") if prefix else ("*", "literal")


def grants(topics: Topics | None = None) -> list[Grant]:
    """Every binding the deployment of `topics` needs (sorted, no duplicates)."""
    topics = topics or Topics()
    p = topics.prefix
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
    for who, prefixes in access.GROUP_PREFIXES.items():
        out.update(Grant(who, "group", p + g, "prefixed", "READ") for g in prefixes)
    for who, prefixes in access.PRIVATE_GROUP_PREFIXES.items():
        out.update(Grant(who, "group", g, "prefixed", "READ") for g in prefixes)
    name, pattern = _every(p)
    for who in (access.DASHBOARD, access.OPERATOR):
        out.add(Grant(who, "group", name, pattern, "DESCRIBE"))
    for who, prefixes in access.INTERNAL_TOPIC_PREFIXES.items():
        for g in prefixes:
            out.add(Grant(who, "topic", p + g, "prefixed", "ALL"))
            out.add(Grant(who, "transactional_id", p + g, "prefixed", "WRITE"))
            out.add(Grant(who, "transactional_id", p + g, "prefixed", "DESCRIBE"))
            out.add(Grant(who, "cluster", CLUSTER, "literal", "IDEMPOTENT_WRITE"))
    return sorted(out)


def open_door_grants() -> list[Grant]:
    """ANONYMOUS may do anything: what `--plaintext-listener` asks for (clients without credentials keep
    working there, exactly as insecure as the broker was before authorization). Never part of `grants`."""
    return [Grant(ANONYMOUS, resource, "*" if resource != "cluster" else CLUSTER, "literal", "ALL")
            for resource in ("topic", "group", "transactional_id", "cluster")]


def _held(client: AdminClient, timeout: float) -> set[Grant]:
    """Every ALLOW binding of a user principal the broker holds (the table's principals and ANONYMOUS)."""
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,  # type: ignore[arg-type]
                           AclOperation.ANY, AclPermissionType.ALLOW)   # None: any name, principal, host
    out = set()
    for b in client.describe_acls(flt, request_timeout=timeout).result(timeout):
        if b.principal.startswith("User:") and b.restype in _RESOURCES.values() \
                and b.resource_pattern_type in _PATTERNS.values():
            out.add(Grant.of(b))
    return out


def describe_acls(client: AdminClient, topics: Topics | None = None, timeout: float = 30.0) -> list[Grant]:
    """The bindings the broker holds that concern the deployment of `topics` (any of `grants(topics)`'s
    resources), sorted: what `apprentice kafka acls --describe` prints."""
    wanted = {(g.resource, g.name, g.pattern) for g in grants(topics)}
    return sorted(g for g in _held(client, timeout) if (g.resource, g.name, g.pattern) in wanted)


def apply_acls(client: AdminClient, wanted: Iterable[Grant], timeout: float = 30.0) -> list[Grant]:
    """Create the bindings of `wanted` the broker does not hold yet; return those created (none on a second
    call). `client` must authenticate as a super user (admin)."""
    missing = sorted(set(wanted) - _held(client, timeout))
    if not missing:
        return []
    for fut in client.create_acls([g.binding() for g in missing], request_timeout=timeout).values():
        fut.result(timeout)
    # a binding is committed to the metadata log before the broker's authorizer holds it; DescribeAcls
    # answers from that authorizer, so once it lists them all, a request they allow is allowed
    deadline = time.monotonic() + timeout
    while not set(missing) <= _held(client, timeout):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the broker did not show {len(missing)} new ACL bindings within {timeout:.0f}s")
        time.sleep(0.1)
    return missing


def table_lines() -> list[str]:
    """The access table in words (`apprentice kafka acls` with no deployment to apply to)."""
    lines = [f"{'topic':<28} {'writers':<40} readers"]
    for a in access.TABLE:
        lines.append(f"{a.topic:<28} {', '.join(sorted(a.writers)):<40} {', '.join(sorted(a.readers))}")
    lines.append("")
    lines.append("consumer groups (after the deployment's topic prefix):")
    for who, prefixes in access.GROUP_PREFIXES.items():
        private = access.PRIVATE_GROUP_PREFIXES.get(who, ())
        lines.append(f"  {who:<10} {', '.join(p + '*' for p in prefixes)}"
                     + (f"  (not namespaced: {', '.join(p + '*' for p in private)})" if private else ""))
    for who, prefixes in access.INTERNAL_TOPIC_PREFIXES.items():
        lines.append(f"  {who:<10} owns its internal topics and transactional ids {', '.join(p + '*' for p in prefixes)}")
    return lines


def access_markdown() -> list[str]:
    """The access table as SECURITY.md prints it (tests/unit/tools/test_kafka_acls.py keeps them equal)."""
    rows = ["| topic | who may write (and sign) | who may read |", "|---|---|---|"]
    rows += [f"| `{a.topic}` | {', '.join(sorted(a.writers))} | {', '.join(sorted(a.readers))} |"
             for a in access.TABLE]
    rows += ["", "| principal | consumer groups (after the deployment's prefix) | also (not namespaced) |",
             "|---|---|---|"]
    for who in access.PRINCIPALS:
        own = ", ".join(f"`{g}*`" for g in access.GROUP_PREFIXES.get(who, ()))
        private = ", ".join(f"`{g}*`" for g in access.PRIVATE_GROUP_PREFIXES.get(who, ()))
        internal = ", ".join(f"topics and transactional ids `{g}*`" for g in access.INTERNAL_TOPIC_PREFIXES.get(who, ()))
        rows.append(f"| {who} | {own} | {'; '.join(x for x in (private, internal) if x) or '-'} |")
    return rows
