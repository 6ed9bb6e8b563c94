"""The broker's ACLs come from the one access table (shared/contracts/topic_access.py), for a deployment's
prefix, and SECURITY.md prints that same table."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from tools.broker.acls import CLUSTER, Grant, access_markdown, grants, open_door_grants

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("prefix", ["", "run-1a2b."])
def test_topic_rights_are_exactly_the_table_for_the_prefix(prefix: str) -> None:
    gs = grants(Topics(prefix))
    for a in access.TABLE:
        name = prefix + a.topic
        on = {g for g in gs if g.resource == "topic" and g.name == name}
        assert all(g.pattern == "literal" for g in on)
        assert {g.principal for g in on if g.operation == "WRITE"} == a.writers, a.topic
        assert {g.principal for g in on if g.operation == "READ"} == a.readers, a.topic
        assert {g.principal for g in on if g.operation == "DESCRIBE"} == set(access.PRINCIPALS)
        assert {g.principal for g in on if g.operation == "DESCRIBE_CONFIGS"} == set(access.PRINCIPALS)
        assert {g.operation for g in on} == {"WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"}   # nobody may create or delete it


def test_every_writer_may_write_idempotently_and_nobody_else() -> None:
    idem = {g.principal for g in grants() if g.resource == "cluster"}
    assert all(g.name == CLUSTER and g.operation == "IDEMPOTENT_WRITE" for g in grants() if g.resource == "cluster")
    assert idem == {w for a in access.TABLE for w in a.writers} | set(access.INTERNAL_TOPIC_PREFIXES)
    assert access.ANALYTICS not in idem


def test_groups_and_internal_resources_carry_the_prefix() -> None:
    prefix = "t-9."
    gs = grants(Topics(prefix))
    own = {(g.principal, g.name) for g in gs if g.resource == "group" and g.operation == "READ"}
    for who, prefixes in access.GROUP_PREFIXES.items():
        assert {(who, prefix + p) for p in prefixes} <= own
    for who, prefixes in access.PRIVATE_GROUP_PREFIXES.items():
        assert {(who, p) for p in prefixes} <= own
    assert all(g.pattern == "prefixed" for g in gs if g.resource in ("group", "transactional_id")
               and g.operation != "DESCRIBE")
    assert Grant("grader", "topic", prefix + "apprentice-grader", "prefixed", "ALL") in gs
    assert Grant("grader", "transactional_id", prefix + "apprentice-grader", "prefixed", "WRITE") in gs
    assert {g.principal for g in gs if g.operation == "ALL"} == {access.GRADER}
    # observers see every group of their deployment (lag), and only describe them
    assert {g for g in gs if g.resource == "group" and g.operation == "DESCRIBE"} == {
        Grant(who, "group", prefix, "prefixed", "DESCRIBE") for who in (access.DASHBOARD, access.OPERATOR)}
    assert {g.name for g in grants() if g.resource == "group" and g.operation == "DESCRIBE"} == {"*"}


def test_admin_and_anonymous_get_no_acl_unless_the_open_door_is_asked_for() -> None:
    assert {g.principal for g in grants()} == set(access.PRINCIPALS)
    assert {g.principal for g in open_door_grants()} == {"ANONYMOUS"}


def test_grants_are_stable() -> None:
    assert grants(Topics("x.")) == grants(Topics("x.")) == sorted(set(grants(Topics("x."))))


def test_security_md_prints_the_access_table() -> None:
    text = (REPO / "SECURITY.md").read_text()
    begin, end = "<!-- access-table:begin (tools/broker/acls.py access_markdown) -->", "<!-- access-table:end -->"
    assert begin in text and end in text
    printed = text.split(begin, 1)[1].split(end, 1)[0].strip().splitlines()
    assert printed == access_markdown(), "SECURITY.md's access table differs from topic_access.py: reprint it"
