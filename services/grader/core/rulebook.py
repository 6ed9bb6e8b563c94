"""Grading rules set at run time (`apprentice grader rules set`) --> the config the grader applies (pure).

The grader's config file (`default_config.yaml`, `APPRENTICE_GRADER_CONFIG_PATH`) is read once at start.
An operator can add, replace and remove the rules of one (tenant, task) while the grader runs by writing
a *rule record* to the compacted topic `apprentice.grader-rules.v1` (shared/contracts/topics.py), keyed
`<tenant>/<task>`. Every grader worker, of either runtime, reads that topic from its beginning and follows
it (rules_follower.py); this module decides what a record means:

- value: a JSON `RuleRecord`: tenant, task, the operator, when, a `revision` (increasing per key), whether
  it deletes the key's rule, and `rules`, a `TaskGraders` document validated with the same pydantic
  schema as the file (shared/grading/schema.py);
- what a runtime rule may hold is narrower than the file: no `verifier` (it imports and calls code
  named in the record) and no `judge` (it needs the judge stage the file configures);
- the record's tenant and task must be those of its key and of its `rules`: a rule written for tenant
  A never applies to tenant B. A wildcard tenant (`*`) needs `wildcard: true` (`--all-tenants`);
- operator identity: a record is applied only when it carries a valid record signature
  (shared/kafka/signing.py, checked by rules_follower.py with shared/kafka/trust.py) by the `operator`
  principal, the only writer of the topic (shared/contracts/topic_access.py); an unsigned record, or
  one signed by any other principal, is refused whatever the broker's ACLs let through. `operator`
  in the record is who ran the CLI, for the record only;
- a record that fails any of this is refused (`RuleRefused`): the grader dead-letters it and keeps the
  rules it had.

Precedence: a runtime rule replaces the file's entry for the same (tenant, task) and otherwise joins the
most-specific lookup of `GraderConfig.for_task`: (tenant, task) > (tenant, *) > (*, task) > (*, *). The
`grader_config_version` of a record graded under a runtime rule is `<file version>+<tenant>/<task>@r<revision>`,
so a change of rules is visible on every record it affects, and only on those.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.grading.schema import GraderConfig, TaskGraders

KEY_PATTERN = r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,127})$"
"""Tenant and task names in a rule: the key ring's tenant syntax, or `*`."""
FORBIDDEN_TYPES = ("verifier", "judge")
MAX_RULE_BYTES = 64 * 1024


class RuleRefused(ValueError):
    """A rule record the grader must not apply; the message says why (dead-letter reason, CLI error)."""


class RuleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(pattern=KEY_PATTERN)
    task: str = Field(default="*", pattern=KEY_PATTERN)
    revision: int = Field(ge=1)
    """Increases with every change of the key's rule (the CLI uses milliseconds since the epoch)."""
    operator: str = Field(min_length=1, max_length=128)
    """Who ran the CLI (informational: the record signature, not this, says an operator wrote it)."""
    set_at: float = 0.0
    deleted: bool = False
    """Removes the key's runtime rule (the file's entry, if any, applies again)."""
    wildcard: bool = False
    """Required for tenant `*`: the rule applies to every tenant without a rule of its own."""
    rules: dict[str, Any] | None = None
    """A TaskGraders document (what one `tasks:` entry of the config file holds)."""

    @property
    def key(self) -> str:
        return rule_key(self.tenant, self.task)

    def graders(self) -> TaskGraders:
        """The validated rules (only for a record that is not a deletion)."""
        return validate_rules(self.rules or {}, tenant=self.tenant, task=self.task)


def rule_key(tenant: str, task: str) -> str:
    return f"{tenant}/{task}"


def validate_rules(doc: Any, *, tenant: str, task: str) -> TaskGraders:
    """A TaskGraders document for (tenant, task) --> the model, or RuleRefused saying what to change."""
    if not isinstance(doc, dict):
        raise RuleRefused(f"rules must be a mapping (one `tasks:` entry of the grader config), got {type(doc).__name__}")
    doc = dict(doc)
    for field, want in (("tenant", tenant), ("task", task)):
        if doc.setdefault(field, want) != want:
            raise RuleRefused(f"the rules name {field} {doc[field]!r} but the rule is for {field} {want!r}")
    for n, g in enumerate(doc.get("graders") or []):
        if isinstance(g, dict) and g.get("type") in FORBIDDEN_TYPES:
            raise RuleRefused(f"graders.{n}: a `{g['type']}` grader can only come from the grader's config file "
                              "(it runs code or needs the judge stage the file configures)")
    try:
        return TaskGraders.model_validate(doc)
    except ValidationError as e:
        lines = [f"invalid rules for {tenant}/{task}:"]
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {loc or '(top level)'}: {err['msg'].removeprefix('Value error, ')}")
        raise RuleRefused("\n".join(lines)) from None


OPERATOR = "operator"
"""The principal whose record signature a rule record must carry (shared/contracts/topic_access.py)."""


def parse_record(key: bytes | None, value: bytes | None, *, signer: str) -> RuleRecord:
    """One record of the rules topic --> a checked RuleRecord, or RuleRefused.

    `signer`: the principal whose valid record signature the record carries, as the caller verified it
    ("" for none); anything but `OPERATOR` is refused before the value is read."""
    k = (key or b"").decode(errors="replace")
    if signer != OPERATOR:
        raise RuleRefused(f"rule {k!r}: not signed by the {OPERATOR} principal "
                          f"({'signed by ' + signer if signer else 'no record signature'})")
    if value is None:
        raise RuleRefused(f"rule {k!r}: an empty value (tombstone) is not a rule record; delete a rule with "
                          "`apprentice grader rules delete`")
    if len(value) > MAX_RULE_BYTES:
        raise RuleRefused(f"rule {k!r}: {len(value)} bytes, over the limit of {MAX_RULE_BYTES}")
    try:
        rec = RuleRecord.model_validate_json(value)
    except ValidationError as e:
        raise RuleRefused(f"rule {k!r}: not a rule record: " + "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in e.errors()[:5])) from None
    if rec.key != k:
        raise RuleRefused(f"rule record for {rec.key!r} under key {k!r}: the key must be <tenant>/<task> of the record")
    if rec.tenant == "*" and not rec.wildcard:
        raise RuleRefused(f"rule {k!r}: a rule for every tenant needs `wildcard: true` (--all-tenants)")
    if not rec.deleted:
        rec.graders()
    return rec


@dataclass(frozen=True)
class Rule:
    record: RuleRecord
    graders: TaskGraders


class RuleBook:
    """The file's config plus the runtime rules in effect; thread-safe (the follower thread writes, the
    grading thread reads). `revision` grows with every change, so readers notice one with an int compare."""

    def __init__(self, config: GraderConfig) -> None:
        self.file = config
        self._rules: dict[str, Rule] = {}
        self._lock = threading.Lock()
        self.revision = 0
        self._effective: tuple[GraderConfig, dict[tuple[str, str], str]] = (config, {})

    def apply(self, rec: RuleRecord) -> bool:
        """Take a checked record; False when it changes nothing (an older or repeated revision)."""
        with self._lock:
            old = self._rules.get(rec.key)
            if old is not None and rec.revision <= old.record.revision:
                return False
            if rec.deleted:
                if old is None:
                    return False
                del self._rules[rec.key]
            else:
                self._rules[rec.key] = Rule(rec, rec.graders())
            self._effective = _merge(self.file, self._rules)
            self.revision += 1
            return True

    @property
    def config(self) -> GraderConfig:
        return self._effective[0]

    def version_of(self, tenant: str, task: str, graders: TaskGraders | None) -> str:
        """`grader_config_version` for a record graded by `graders` (the entry `for_task` returned)."""
        config, versions = self._effective
        if graders is None:
            return config.version
        return versions.get((graders.tenant, graders.task), self.file.version)

    def rules(self) -> list[RuleRecord]:
        with self._lock:
            return [r.record for r in self._rules.values()]


def _merge(file: GraderConfig, rules: dict[str, Rule]) -> tuple[GraderConfig, dict[tuple[str, str], str]]:
    by_key = {(t.tenant, t.task): t for t in file.tasks}
    versions: dict[tuple[str, str], str] = {}
    for r in rules.values():
        k = (r.record.tenant, r.record.task)
        by_key[k] = r.graders
        versions[k] = f"{file.version}+{r.record.key}@r{r.record.revision}"
    merged = GraderConfig.model_construct(version=file.version, tasks=list(by_key.values()), detectors=file.detectors)
    return merged, versions


def new_record(tenant: str, task: str, *, operator: str, rules: dict[str, Any] | None, deleted: bool = False,
               wildcard: bool = False, now: float | None = None) -> RuleRecord:
    """A record the CLI writes (validated: RuleRefused says what to change)."""
    now = time.time() if now is None else now
    for what, v in (("tenant", tenant), ("task", task)):
        if not re.match(KEY_PATTERN, v):
            raise RuleRefused(f"{what} {v!r}: use letters, digits, '.', '_' or '-' (or '*')")
    if tenant == "*" and not wildcard:
        raise RuleRefused("a rule for every tenant (--tenant '*') needs --all-tenants")
    rec = RuleRecord(tenant=tenant, task=task, revision=int(now * 1000), operator=operator, set_at=now,
                     deleted=deleted, wildcard=tenant == "*", rules=None if deleted else rules)
    if not deleted:
        rec = rec.model_copy(update={"rules": {**(rules or {}), "tenant": tenant, "task": task}})
        rec.graders()
    return rec
