"""The broker's ACLs for the deployments outside this machine (the Helm chart, docker compose, a cluster
managed by hand), generated from the one access table (shared/contracts/topic_access.py) through the one
derivation of bindings, `shared.kafka.grants.grants`.

Why one derivation: the local broker, the chart's Strimzi `KafkaUser` resources, the `kafka-acls.sh`
commands of docs/deployment.md and the compose init container must grant exactly the same rights, or a
service that works in one deployment is refused in another (or, worse, a principal is allowed more in
production than anywhere it is tested). tests/deploy/test_helm_acls.py fails when the chart's ACLs differ
from `grants()`.

A deployment's prefix (`topicPrefix` in the chart, `APPRENTICE_TOPIC_PREFIX`) namespaces the contract
topics, consumer groups (the private readers' too), transactional ids and the grader's own topics, and so
its bindings: two releases with different prefixes on one cluster are granted disjoint resources
(docs/deployment.md, "Several stacks on one cluster"). The chart knows its prefix only when it renders, so
each rule generated for it says whether its name takes the prefix (`namespaced`): the bindings are computed
once with a sentinel prefix, and a name that starts with the sentinel is a namespaced one (every name but the
cluster's, today).

Commands (`python -m tools.deploy_acls ...`):
  helm [--check]          write (or check) deploy/helm/apprentice/files/kafka-acls.yaml (`make helm-acls`)
  kafka-acls-sh [--prefix P]
                          print the kafka-acls.sh commands for a cluster without Strimzi
  compose-secrets DIR     generate each principal's password once, under DIR/<principal>/password
  compose-apply DIR       as admin, give every principal its SCRAM credential from DIR and apply the ACLs
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics
from tools.broker.acls import Grant, apply_acls, grants, prefix_problem

REPO = Path(__file__).resolve().parents[1]
HELM_FILE = REPO / "deploy" / "helm" / "apprentice" / "files" / "kafka-acls.yaml"
"""The chart reads it with `.Files.Get` (templates/kafka-strimzi.yaml): generated, never edited by hand."""

_SENTINEL = "\x00prefix\x00"
"""Stands for the deployment's prefix while the bindings are derived; no real name contains NUL."""

STRIMZI_RESOURCE = {"topic": "topic", "group": "group", "transactional_id": "transactionalId", "cluster": "cluster"}
STRIMZI_PATTERN = {"literal": "literal", "prefixed": "prefix"}
KAFKA_ACLS_RESOURCE = {"topic": "--topic", "group": "--group", "transactional_id": "--transactional-id",
                       "cluster": "--cluster"}
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
"""Kafka's default for SCRAM-SHA-512 (and the floor it accepts is 4096)."""


def _operation(name: str) -> str:
    """Kafka's operation in the spelling of Strimzi and kafka-acls.sh: IDEMPOTENT_WRITE -> IdempotentWrite."""
    return "".join(part.capitalize() for part in name.split("_"))


@dataclass(frozen=True, order=True)
class Rule:
    """The rights of one principal on one resource pattern, independent of the deployment's prefix."""

    principal: str
    resource: str
    """As in tools/broker/acls.py: "topic", "group", "transactional_id" or "cluster"."""
    name: str
    """Without the deployment's prefix when `namespaced`."""
    pattern: str
    namespaced: bool
    operations: tuple[str, ...]
    """Kafka's upper-case operation names, sorted."""

    def resolve(self, prefix: str) -> tuple[str, str]:
        """(name, pattern) in the deployment of `prefix`."""
        return (prefix + self.name if self.namespaced else self.name), self.pattern

    def grants(self, prefix: str) -> list[Grant]:
        name, pattern = self.resolve(prefix)
        return [Grant(self.principal, self.resource, name, pattern, op) for op in self.operations]


def rules() -> list[Rule]:
    """Every principal's rights, grouped by resource pattern (one Strimzi ACL entry, one kafka-acls.sh
    command each), sorted."""
    ops: dict[tuple[str, str, str, str, bool], set[str]] = defaultdict(set)
    for g in grants(Topics(_SENTINEL)):
        namespaced = g.name.startswith(_SENTINEL)
        name = g.name.removeprefix(_SENTINEL)
        ops[(g.principal, g.resource, name, g.pattern, namespaced)].add(g.operation)
    return sorted(Rule(*key, operations=tuple(sorted(o))) for key, o in ops.items())


# --- Helm / Strimzi ---------------------------------------------------------------------------------------

def strimzi_acls() -> dict[str, list[dict[str, Any]]]:
    """principal -> its `KafkaUser` ACL entries, prefix-independent (the chart resolves `namespaced`)."""
    out: dict[str, list[dict[str, Any]]] = {p: [] for p in access.PRINCIPALS}
    for r in rules():
        entry: dict[str, Any] = {"type": STRIMZI_RESOURCE[r.resource]}
        if r.resource != "cluster":
            entry |= {"name": r.name, "patternType": STRIMZI_PATTERN[r.pattern], "namespaced": r.namespaced}
        entry["operations"] = [_operation(o) for o in r.operations]
        out[r.principal].append(entry)
    return out


def helm_file() -> str:
    header = ("# Generated from shared/contracts/topic_access.py by `make helm-acls` (tools/deploy_acls.py):\n"
              "# do not edit. Each principal's KafkaUser ACLs (templates/kafka-strimzi.yaml); `namespaced`\n"
              "# names take the release's topicPrefix. tests/deploy/test_helm_acls.py keeps it in step.\n")
    lines = [header.rstrip("\n"), "principals:"]
    for principal, acls in strimzi_acls().items():
        lines.append(f"  {principal}:")
        lines += [f"    - {yaml.safe_dump(a, default_flow_style=True, sort_keys=False, width=200).strip()}" for a in acls]
    return "\n".join(lines) + "\n"


def strimzi_grants(kafka_users: list[dict[str, Any]]) -> set[Grant]:
    """The bindings a list of rendered `KafkaUser` resources asks Strimzi for (SCRAM users: the principal is
    the resource's name), in tools/broker/acls.py's terms: what a test compares with `grants()`."""
    resource = {v: k for k, v in STRIMZI_RESOURCE.items()}
    pattern = {v: k for k, v in STRIMZI_PATTERN.items()}
    out: set[Grant] = set()
    for user in kafka_users:
        principal = user["metadata"]["name"]
        for acl in (user["spec"].get("authorization") or {}).get("acls", []):
            res = acl["resource"]
            kind = resource[res["type"]]
            name = "kafka-cluster" if kind == "cluster" else res["name"]
            for op in acl["operations"]:
                upper = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(op)).upper()
                out.add(Grant(principal, kind, name, pattern[res.get("patternType", "literal")], upper))
    return out


# --- kafka-acls.sh --------------------------------------------------------------------------------------

def kafka_acls_commands(prefix: str = "", bootstrap: str = "$BOOTSTRAP",
                        command_config: str = "admin.properties") -> list[str]:
    """One `kafka-acls.sh --add` per rule (all its operations at once), for a cluster the chart does not
    manage; run as the super user (`command_config` holds its client settings)."""
    out = []
    for r in rules():
        name, pattern = r.resolve(prefix)
        resource = ["--cluster"] if r.resource == "cluster" else [KAFKA_ACLS_RESOURCE[r.resource], name]
        argv = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", command_config, "--add",
                "--allow-principal", f"User:{r.principal}", *resource]
        if r.resource != "cluster":
            argv += ["--resource-pattern-type", pattern]
        for op in r.operations:
            argv += ["--operation", _operation(op)]
        out.append(" ".join(a if a.startswith("$") else shlex.quote(a) for a in argv))
    return out


# --- docker compose -------------------------------------------------------------------------------------

KAFKA_UID = 1000
"""`appuser` of the apache/kafka image: the broker reads the admin password at start."""


def compose_secrets(root: Path) -> list[str]:
    """Generate, once, a password (256 random bits) for every principal and for `admin`, each in its own
    folder `root/<principal>/password`, so compose mounts each service's folder alone (a volume subpath):
    no service can read another's password. Existing passwords are kept. Returns the principals whose
    password was created now."""
    created = []
    for principal in (*access.PRINCIPALS, access.ADMIN):
        folder = root / principal
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        f = folder / "password"
        if f.exists() and f.read_text().strip():
            continue
        tmp = folder / ".password.tmp"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
        os.replace(tmp, f)   # a container stopped half-way never leaves a truncated password behind
        created.append(principal)
    if os.geteuid() == 0:   # the broker (not root) must read the admin password; nobody else mounts it
        for path in (root / access.ADMIN, root / access.ADMIN / "password"):
            os.chown(path, KAFKA_UID, KAFKA_UID)
    return created


def _password(root: Path, principal: str) -> str:
    return (root / principal / "password").read_text().strip()


def compose_apply(root: Path, topics: Topics, timeout: float = 120.0) -> tuple[int, int]:
    """Give every principal its SCRAM credential (upserted: the broker holds what the files say, also after
    a password was replaced) and create the missing ACLs of the deployment of `topics`. The client is
    `admin` as the environment configures it (APPRENTICE_KAFKA_*). Returns (users, ACLs created)."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    from shared.kafka.admin import admin, wait_for_broker
    from shared.settings import CommonSettings

    settings = CommonSettings()
    if settings.kafka_sasl_username != access.ADMIN:
        raise SystemExit(f"compose-apply runs as {access.ADMIN!r} (APPRENTICE_KAFKA_SASL_USERNAME), "
                         f"not {settings.kafka_sasl_username!r}")
    wait_for_broker(settings.kafka_bootstrap, timeout)
    client = admin(settings.kafka_bootstrap)
    upserts: list[UserScramCredentialAlteration] = [UserScramCredentialUpsertion(p, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
                                            _password(root, p).encode()) for p in access.PRINCIPALS]
    deadline = time.monotonic() + timeout
    for fut in client.alter_user_scram_credentials(upserts).values():
        fut.result(max(1.0, deadline - time.monotonic()))
    created = apply_acls(client, grants(topics), timeout=max(1.0, deadline - time.monotonic()))
    return len(upserts), len(created)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.deploy_acls", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    helm = sub.add_parser("helm", help="write the chart's ACL file (make helm-acls)")
    helm.add_argument("--check", action="store_true", help="only fail when the file is not what the table says")
    sh = sub.add_parser("kafka-acls-sh", help="print the kafka-acls.sh commands")
    sh.add_argument("--prefix", default="", help="the deployment's topic prefix (default: none)")
    sh.add_argument("--bootstrap", default="$BOOTSTRAP")
    sh.add_argument("--command-config", default="admin.properties")
    for name in ("compose-secrets", "compose-apply"):
        p = sub.add_parser(name)
        p.add_argument("root", type=Path, help="the folder of the principals' password folders")
    args = parser.parse_args(argv)

    if args.command == "helm":
        text = helm_file()
        if args.check:
            if not HELM_FILE.exists() or HELM_FILE.read_text() != text:
                print(f"{HELM_FILE.relative_to(REPO)} is stale: run `make helm-acls`", file=sys.stderr)
                return 1
            return 0
        HELM_FILE.parent.mkdir(parents=True, exist_ok=True)
        HELM_FILE.write_text(text)
        print(f"wrote {HELM_FILE.relative_to(REPO)}")
    elif args.command == "kafka-acls-sh":
        problem = prefix_problem(args.prefix)
        if problem is not None:
            print(f"python -m tools.deploy_acls kafka-acls-sh: {problem}", file=sys.stderr)
            return 2
        print("\n".join(kafka_acls_commands(args.prefix, args.bootstrap, args.command_config)))
    elif args.command == "compose-secrets":
        created = compose_secrets(args.root)
        print(f"kafka passwords: {len(created)} generated ({', '.join(created) or 'all kept'})")
    else:
        from shared.settings import CommonSettings

        users, acls = compose_apply(args.root, Topics(CommonSettings().topic_prefix))
        print(f"kafka access: {users} SCRAM users upserted, {acls} ACLs created")
    return 0


if __name__ == "__main__":
    sys.exit(main())
