"""The broker's ACLs come from the one access table (shared/contracts/topic_access.py), for a deployment's
prefix, and SECURITY.md prints that same table."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from shared.kafka.grants import PrefixClash, prefix_problem
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
        # only the operator's `apprentice topics` creates it, and nobody may delete it
        assert {g.principal for g in on if g.operation == "CREATE"} == set(access.TOPIC_CREATORS) == {access.OPERATOR}
        assert {g.operation for g in on} == {"WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS", "CREATE"}


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
    for who, prefixes in access.PRIVATE_GROUP_PREFIXES.items():   # the private readers' groups too
        assert {(who, prefix + p) for p in prefixes} <= own
    assert all(g.pattern == "prefixed" for g in gs if g.resource in ("group", "transactional_id")
               and g.operation != "DESCRIBE")
    assert Grant("grader", "topic", prefix + "apprentice-grader", "prefixed", "ALL") in gs
    assert Grant("grader", "transactional_id", prefix + "apprentice-grader", "prefixed", "WRITE") in gs
    assert {g.principal for g in gs if g.operation == "ALL"} == {access.GRADER}
    # observers see every group of their deployment (lag), and only describe them
    assert {g for g in gs if g.resource == "group" and g.operation == "DESCRIBE"} == {
        Grant(who, "group", name, "prefixed", "DESCRIBE") for who in (access.DASHBOARD, access.OPERATOR)
        for name in {g.name for g in gs if g.resource == "group" and g.operation == "READ"}}
    assert all(g.name not in ("*", "") for g in grants() if g.resource != "cluster")   # no wildcard, unprefixed too


@pytest.mark.parametrize(("a", "b"), [("", "staging."), ("staging.", "prod."), ("staging.", "staging.run-1a2b.")])
def test_two_prefixes_are_granted_disjoint_resources(a: str, b: str) -> None:
    """Nothing a deployment's bindings grant names a resource of another prefix's deployment (#51): every
    topic, group, transactional id and internal topic a principal of `b` uses, and of `a`."""
    for mine, theirs in ((a, b), (b, a)):
        granted = [g for g in grants(Topics(mine)) if g.resource != "cluster"]
        for g in grants(Topics(theirs)):
            if g.resource == "cluster":
                continue
            # the names of the other deployment: a literal one as it is; a prefixed one by a name under it
            name = g.name if g.pattern == "literal" else g.name + "x"
            assert not any(mine_g.covers(g.resource, name) for mine_g in granted), (mine, theirs, g)


def test_a_prefix_the_unprefixed_acls_would_cover_is_refused() -> None:
    with pytest.raises(PrefixClash, match="'weights-b.' starts with 'weights'"):
        grants(Topics("weights-b."))
    assert prefix_problem("extractor.") is not None and prefix_problem("staging.") is None
    assert prefix_problem("") is None


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
