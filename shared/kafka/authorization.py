"""A Kafka authorization refusal --> one line naming the principal, the resource, the operation and the
command that grants it.

The broker authorizes every request (docs/deployment.md, "Kafka security"): what the access table
(shared/contracts/topic_access.py) does not grant a principal for its deployment's prefix, or what the
broker was never given the ACLs of, is refused with one of four error codes (topic, group, transactional
id, cluster). Left alone, such a refusal surfaced as a traceback at start (`ensure_topics`), as a consumer
error repeated forever, or as a failed delivery, none of which says who was refused what, nor what to run.
Here, once:

- `KafkaAccessDenied`: the refusal as a value and its one line, e.g. "the Kafka broker refuses principal
  'extractor' READ on topic 'staging.apprentice.graded.v1': ... `apprentice kafka acls --prefix staging.
  --apply` ...". The command follows from the access table (shared/kafka/grants.py): an operation the table
  grants means the deployment's ACLs are missing on the broker (`apprentice kafka acls --apply`, or the
  `kafka-acls.sh` lines of another cluster); CREATE on a contract topic by a service means the topics do not
  exist yet (`apprentice topics`); anything else is a process running with another principal's credentials.
  A startup error (shared/startup.py: exit 2, one line); the CLI prints the same line.
- `denied(...)`: a client error (confluent-kafka's `KafkaError` / `KafkaException`, aiokafka's errors)
  --> `KafkaAccessDenied`, or None when the error is not an authorization refusal.
- `report(...)`: at run time a refusal is counted (`apprentice_kafka_authorization_refusals_total`) and
  logged as that one line at most once per 30 s per resource and operation; the consumer or producer goes on
  (the record is redelivered, or its delivery failure handled as any other) once the grant is applied.
- `check_access(...)`: what a service checks at start (shared/kafka/durability.py `check_at_start`): the
  broker's own answer for each topic and group the table grants its principal (Kafka's authorized
  operations), so a missing grant stops the service with its line before anything runs.
"""

from __future__ import annotations

import logging
import shlex
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from prometheus_client import Counter

from shared.contracts import topic_access as access
from shared.contracts.topics import Topics, contract_name
from shared.kafka.grants import PrefixClash, allowed, grants
from shared.kafka.rate_limit import RateLimiter
from shared.kafka.security import SecuritySource, librdkafka_config, resolve
from shared.settings import CommonSettings

log = logging.getLogger(__name__)

RESOURCE_OF_CODE: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional_id",
}
"""Kafka's authorization error codes (29, 30, 31, 53; the same numbers in aiokafka) and what each refuses."""

RESOURCE_WORDS = {"topic": "topic", "group": "consumer group", "transactional_id": "transactional id",
                  "cluster": "the cluster"}

REFUSALS = Counter("apprentice_kafka_authorization_refusals_total",
                   "Kafka requests the broker refused this process's principal (a missing ACL)",
                   ["resource", "operation"])

_LIMITER = RateLimiter()


class KafkaAccessDenied(PermissionError):
    """The broker refused `principal` the `operation` on `resource` `name`; `str()` is the one line that says
    so and names the command that grants it."""

    def __init__(self, principal: str, resource: str, name: str, operation: str, prefix: str, *,
                 more: int = 0, detail: str = "") -> None:
        self.principal, self.resource, self.name, self.operation = principal, resource, name, operation
        self.prefix, self.more, self.detail = prefix, more, detail
        super().__init__(self.line())

    @property
    def what(self) -> str:
        """"READ on topic 'x'" (an unknown operation or name reads as "a request on a topic")."""
        op = self.operation or "a request"
        if self.resource == "cluster":
            return f"{op} on the cluster"
        where = RESOURCE_WORDS.get(self.resource, self.resource)
        return f"{op} on {where} {self.name!r}" if self.name else f"{op} on a {where}"

    def line(self) -> str:
        more = f" (and {self.more} more)" if self.more else ""
        detail = f" [{self.detail}]" if self.detail else ""
        return (f"the Kafka broker refuses principal {self.principal!r} {self.what}{more}{detail}: "
                f"{remedy(self.principal, self.resource, self.name, self.operation, self.prefix)}")


def principal_of(security: SecuritySource = None) -> str:
    """The principal the broker sees for a client with `security`: its SASL user, User:ANONYMOUS without
    authentication, the client certificate's subject with TLS alone."""
    sec = resolve(security)
    if sec.sasl:
        return sec.username or "?"
    return "the TLS client certificate's subject" if sec.tls else "ANONYMOUS"


def _q(value: str) -> str:
    return shlex.quote(value)


def acls_command(prefix: str) -> str:
    """The command that applies a deployment's ACLs, on the local broker and on another cluster."""
    opt = f" --prefix {_q(prefix)}" if prefix else ""
    return (f"`apprentice kafka acls{opt} --apply` (the local broker), or on another cluster its admin runs "
            f"what `python -m tools.deploy_acls kafka-acls-sh{opt}` prints (docs/deployment.md)")


def topics_command(prefix: str) -> str:
    env = f"APPRENTICE_TOPIC_PREFIX={_q(prefix)} " if prefix else ""
    return f"`{env}apprentice topics`"


def remedy(principal: str, resource: str, name: str, operation: str, prefix: str) -> str:
    """What grants `principal` the refused request, from the access table of the deployment `prefix`."""
    if principal == "ANONYMOUS":
        return ("the broker authorizes requests and this client sends no credentials: set "
                "APPRENTICE_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT (or SASL_SSL) and the SASL user and password of "
                "this process's principal (docs/deployment.md, \"Kafka security\")")
    if principal not in access.PRINCIPALS:
        return (f"the access table (shared/contracts/topic_access.py) grants {principal!r} nothing: run each process "
                f"as its own principal ({', '.join(access.PRINCIPALS)}), then apply the ACLs: {acls_command(prefix)}")
    try:
        table = grants(Topics(prefix))
    except PrefixClash as e:      # a prefix the table cannot grant on its own (shared/kafka/grants.py)
        return str(e)
    if resource == "topic" and operation == "CREATE" and name in {s.name for s in Topics(prefix).specs()} \
            and principal not in access.TOPIC_CREATORS:
        return (f"the topic does not exist and only {', '.join(access.TOPIC_CREATORS)} (or admin) may create the "
                f"topics: {topics_command(prefix)}")
    if not operation or (not name and resource != "cluster"):   # the client did not say what was refused
        return (f"if the access table grants it, the broker lacks the ACLs of the prefix {prefix!r}: "
                f"{acls_command(prefix)}")
    if allowed(table, principal, resource, name, operation):
        return f"the access table grants it, the broker lacks the ACLs of the prefix {prefix!r}: {acls_command(prefix)}"
    return (f"the access table (shared/contracts/topic_access.py) does not grant it to {principal!r}: this process "
            f"runs with another principal's credentials (APPRENTICE_KAFKA_SASL_USERNAME), or the table must grant it "
            f"(then {acls_command(prefix)})")


def _code(err: Any) -> int | None:
    """The Kafka error code of a client error: confluent-kafka's KafkaError or KafkaException, or an aiokafka
    error (its class's `errno`, Kafka's protocol number)."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if isinstance(err, KafkaError):
        return int(err.code())
    errno = getattr(type(err), "errno", None)
    return errno if isinstance(errno, int) and type(err).__module__.startswith("aiokafka") else None


def is_refusal(err: Any) -> bool:
    code = _code(err)
    return code is not None and code in RESOURCE_OF_CODE


def denied(err: Any, *, name: str = "", operation: str = "", group: str = "", security: SecuritySource = None,
           prefix: str | None = None) -> KafkaAccessDenied | None:
    """`err` as a `KafkaAccessDenied` when it is an authorization refusal, else None. `name` and `operation`:
    what the caller asked for (a refusal does not say): the topic, or `group` when the refusal is its consumer
    group's; `security`: the client's (None: the environment's); `prefix`: the deployment's (None: the one the
    contract topic `name` carries, else the settings' or the environment's)."""
    code = _code(err)
    if code is None or code not in RESOURCE_OF_CODE:
        return None
    resource = RESOURCE_OF_CODE[code]
    if resource == "cluster" and not operation and "idempotence" in str(err):
        operation = "IDEMPOTENT_WRITE"        # librdkafka's "Failed to acquire idempotence PID"
    settings = security if isinstance(security, CommonSettings) else None
    base = contract_name(name) if name else None
    if prefix is None:
        prefix = name.removesuffix(base) if base else (settings or CommonSettings()).topic_prefix
    name = {"cluster": "", "group": group, "transactional_id": ""}.get(resource, name)
    return KafkaAccessDenied(principal_of(security), resource, name, operation, prefix)


def raise_if_denied(err: Any, **context: Any) -> None:
    """Raise `err` as a `KafkaAccessDenied` (see `denied`) when it is an authorization refusal."""
    refusal = denied(err, **context)
    if refusal is not None:
        raise refusal from (err if isinstance(err, BaseException) else None)


def report(refusal: KafkaAccessDenied, logger: logging.Logger | None = None) -> None:
    """A refusal at run time: counted, and its line logged at most once per 30 s per resource and operation."""
    REFUSALS.labels(refusal.resource, refusal.operation or "unknown").inc()
    held = _LIMITER.allow(f"{refusal.resource}:{refusal.name}:{refusal.operation}")
    if held is not None:
        (logger or log).error("%s%s", refusal.line(),
                              f" [{held} more in the last {_LIMITER.interval_s:.0f}s]" if held else "",
                              extra={"kafka_principal": refusal.principal, "kafka_resource": refusal.resource,
                                     "kafka_name": refusal.name, "kafka_operation": refusal.operation})


def report_error(err: Any, *, name: str = "", operation: str = "", group: str = "", security: SecuritySource = None,
                 prefix: str | None = None, logger: logging.Logger | None = None) -> bool:
    """`report` the refusal `err` is (see `denied`); False when it is none (the caller handles it as before)."""
    refusal = denied(err, name=name, operation=operation, group=group, security=security, prefix=prefix)
    if refusal is None:
        return False
    report(refusal, logger)
    return True


# --- at start ---------------------------------------------------------------------------------------------

def _needed(principal: str, topics: Topics) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """What the table grants `principal` that a client can ask the broker about: {topic: operations} (contract
    topics, and the internal topics' prefix as a name), {group prefix: operations}."""
    by_topic: dict[str, set[str]] = {}
    by_group: dict[str, set[str]] = {}
    for g in grants(topics):
        if g.principal != principal:
            continue
        if g.resource == "topic":
            # an internal topic's prefix, asked as a name, stands for every topic of it (ALL implies DESCRIBE)
            by_topic.setdefault(g.name, set()).add("DESCRIBE" if g.pattern == "prefixed" else g.operation)
        elif g.resource == "group" and g.operation == "READ":
            by_group.setdefault(g.name, set()).add("READ")
    for ops in by_topic.values():
        ops.discard("CREATE")      # not asked: the broker answers CREATE only for topics that exist
    return by_topic, by_group


def check_access(client: AdminClient, settings: CommonSettings, timeout: float = 5.0) -> None:
    """`KafkaAccessDenied` for the first grant of the access table that the broker does not give this
    process's principal (`settings`' SASL user) for its deployment: a topic it may not describe, read, write or
    describe the configuration of (Kafka's authorized operations of each topic), a consumer group it may not
    read. Topics that do not exist yet are not refused (the services that need them create them or wait).
    Nothing is checked for a principal outside the table (admin, a user's own), nor when the broker does not
    answer within `timeout` (the next start checks again)."""
    principal = principal_of(settings)
    if principal not in access.PRINCIPALS:
        return
    by_topic, by_group = _needed(principal, settings.topics)
    refused: list[tuple[str, str, str]] = []
    try:
        futures = client.describe_topics(TopicCollection(sorted(by_topic)), request_timeout=timeout,
                                         include_authorized_operations=True)
        for name, fut in futures.items():
            try:
                got = fut.result(timeout)
            except KafkaException as e:
                if is_refusal(e):
                    refused.append(("topic", name, "DESCRIBE"))
                elif e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
                continue
            # the broker's own answer, implied operations included (READ implies DESCRIBE, ...); an empty one:
            # it did not say (no authorizer), nothing to check
            held = {getattr(op, "name", str(op)) for op in (got.authorized_operations or [])}
            if held:
                refused += [("topic", name, op) for op in sorted(by_topic[name] - held)]
        if by_group:
            for name, fut in client.describe_consumer_groups(sorted(by_group), request_timeout=timeout,
                                                             include_authorized_operations=True).items():
                try:
                    fut.result(timeout)
                except KafkaException as e:
                    if not is_refusal(e):
                        raise
                    refused.append(("group", name, "READ"))
    except KafkaException as e:          # timed out, broker gone meanwhile: not this check's to report
        log.warning("kafka access not checked: %s", e.args[0].str() if e.args else e)
        return
    if refused:
        resource, name, op = sorted(refused)[0]
        raise KafkaAccessDenied(principal, resource, name, op, settings.topic_prefix, more=len(refused) - 1)


def check_access_at_start(settings: CommonSettings, timeout: float = 5.0) -> None:
    """`check_access` on a client of its own, for a process that runs no other start-up check of its cluster
    (the dashboard; the other services run it within shared/kafka/durability.py `check_at_start`). A broker
    that does not answer within `timeout` is not waited for."""
    client = AdminClient({**librdkafka_config(settings), "bootstrap.servers": settings.kafka_bootstrap,
                          "log_level": 0})
    try:
        client.list_topics(timeout=timeout)
    except KafkaException:
        log.warning("kafka access not checked: no broker answered", extra={"bootstrap": settings.kafka_bootstrap})
        return
    check_access(client, settings, timeout=timeout)
