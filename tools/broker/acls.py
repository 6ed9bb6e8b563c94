"""The broker's ACLs and SCRAM users of a deployment: the bindings of shared/kafka/grants.py (derived from the
one access table, shared/contracts/topic_access.py, for the deployment's prefix) applied to and read back
from a broker.

`apply_acls` creates what is missing and nothing else (applying twice creates nothing); `describe_acls`
reads back what the broker holds for a deployment. `ensure_scram_users` gives every principal its SCRAM
credential (generated passwords, tools/broker/local_broker.py). Nothing grants CREATE on a contract topic
but to `operator` for its own deployment's topics (`apprentice topics`); `admin`, the super user, needs no
ACL.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka.grants import CLUSTER, PATTERNS, RESOURCES, Grant, grants, group_prefixes, prefix_problem

__all__ = ["ANONYMOUS", "CLUSTER", "Grant", "access_markdown", "apply_acls", "describe_acls", "grants",
           "open_door_grants", "prefix_problem", "table_lines"]

ANONYMOUS = "ANONYMOUS"
"""The principal of a client on a PLAINTEXT listener (no authentication)."""


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
        if b.principal.startswith("User:") and b.restype in RESOURCES.values() \
                and b.resource_pattern_type in PATTERNS.values():
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
    lines.append(f"the topics are created by: {', '.join(access.TOPIC_CREATORS)} (and admin)")
    lines.append("consumer groups (after the deployment's topic prefix, as every name below):")
    for who in access.PRINCIPALS:
        lines.append(f"  {who:<10} {', '.join(p + '*' for p in group_prefixes(who))}")
    for who, prefixes in access.INTERNAL_TOPIC_PREFIXES.items():
        lines.append(f"  {who:<10} owns its internal topics and transactional ids {', '.join(p + '*' for p in prefixes)}")
    return lines


def access_markdown() -> list[str]:
    """The access table as SECURITY.md prints it (tests/unit/tools/test_kafka_acls.py keeps them equal)."""
    rows = ["| topic | who may write (and sign) | who may read |", "|---|---|---|"]
    rows += [f"| `{a.topic}` | {', '.join(sorted(a.writers))} | {', '.join(sorted(a.readers))} |"
             for a in access.TABLE]
    rows += ["", "| principal | consumer groups (each after the deployment's prefix) | also (after the prefix too) |",
             "|---|---|---|"]
    for who in access.PRINCIPALS:
        groups = ", ".join(f"`{g}*`" for g in group_prefixes(who))
        also = [f"topics and transactional ids `{g}*`" for g in access.INTERNAL_TOPIC_PREFIXES.get(who, ())]
        if who in access.TOPIC_CREATORS:
            also.append("creates the contract topics")
        rows.append(f"| {who} | {groups} | {'; '.join(also) or '-'} |")
    return rows
