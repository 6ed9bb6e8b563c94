"""What a consumer is for --> a confluent-kafka `Consumer` configured the way every Apprentice consumer must be.

Every consumer in services/, shared/, tools/ and the test helpers is built here, so the parts that are
easy to forget are applied once:

- the bootstrap address and the TLS/SASL settings (shared/kafka/security.py: one set of variables
  secures every client);
- librdkafka's logs and errors routed through Python logging (shared/kafka/client_logs.py);
- `client.id` = "apprentice-<purpose>", so the broker's logs and its group listings say who reads;
- offsets are never committed or stored behind the caller's back (`enable.auto.commit` and
  `enable.auto.offset.store` off): a record counts as consumed when the caller commits it after its
  effect (shared/kafka/consumer.py), or never (readers of state, which keep their own positions);
- `read_committed`: records of aborted or still open transactions (the grader writes transactionally)
  are never seen, unless a caller asks for `read_uncommitted` to see them on purpose.

The options are named; `consumer_config` returns the dictionary so that a test can check it without a
broker.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from confluent_kafka import Consumer

from shared.kafka.client_logs import client_log_config
from shared.kafka.security import SecuritySource, librdkafka_config
from shared.settings import CommonSettings

Isolation = Literal["read_committed", "read_uncommitted"]
OffsetReset = Literal["earliest", "latest"]


def private_group(purpose: str, prefix: str = "") -> str:
    """A group id no other consumer shares ("<prefix><purpose>-<uuid>"): for readers that assign partitions
    themselves and commit nothing (librdkafka still requires a group id). `prefix` is the deployment's topic
    prefix: like every group, a private one belongs to its deployment, whose ACLs grant it
    (shared/kafka/grants.py) and no other deployment's do."""
    return f"{prefix}{purpose}-{uuid.uuid4()}"


def _deployment_prefix(security: SecuritySource) -> str:
    """The topic prefix of the deployment a consumer reads for: its settings', else the environment's."""
    return (security if isinstance(security, CommonSettings) else CommonSettings()).topic_prefix


def consumer_config(bootstrap: str, *, purpose: str, group_id: str | None = None,
                    security: SecuritySource = None, isolation: Isolation = "read_committed",
                    offset_reset: OffsetReset = "earliest", partition_eof: bool = False,
                    log_level: int | None = None, session_timeout_ms: int | None = None,
                    heartbeat_interval_ms: int | None = None,
                    max_poll_interval_ms: int | None = None) -> dict[str, Any]:
    """The librdkafka configuration of `new_consumer` (see there)."""
    config: dict[str, Any] = {
        **librdkafka_config(security),
        **client_log_config(bootstrap),
        "bootstrap.servers": bootstrap,
        "client.id": f"apprentice-{purpose}",
        "group.id": group_id or private_group(purpose, _deployment_prefix(security)),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": isolation,
        "auto.offset.reset": offset_reset,
        "enable.partition.eof": partition_eof,
    }
    optional = {"log_level": log_level, "session.timeout.ms": session_timeout_ms,
                "heartbeat.interval.ms": heartbeat_interval_ms, "max.poll.interval.ms": max_poll_interval_ms}
    config.update({k: v for k, v in optional.items() if v is not None})
    return config


def new_consumer(bootstrap: str, *, purpose: str, group_id: str | None = None,
                 security: SecuritySource = None, isolation: Isolation = "read_committed",
                 offset_reset: OffsetReset = "earliest", partition_eof: bool = False,
                 log_level: int | None = None, session_timeout_ms: int | None = None,
                 heartbeat_interval_ms: int | None = None, max_poll_interval_ms: int | None = None) -> Consumer:
    """A consumer of `bootstrap` (the module docstring says what every one gets).

    - `purpose`: a short name of what reads ("trainer-graded", "apprentice-tail"): the client id, and the
      prefix of the private group used when `group_id` is None;
    - `group_id`: the consumer group (already namespaced by the caller, shared/contracts/topics.py);
    - `security`: TLS/SASL settings (resolved, or the `CommonSettings` to take them from); None = the
      environment;
    - `offset_reset`: where a group without a committed offset starts;
    - `partition_eof`: deliver an end-of-partition event each time a partition is read to its end;
    - `log_level`: librdkafka's syslog level (3: errors only, for consumers that outlive broker restarts);
    - the three timeouts: group membership (librdkafka's defaults when None).
    """
    return Consumer(consumer_config(bootstrap, purpose=purpose, group_id=group_id, security=security,
                                    isolation=isolation, offset_reset=offset_reset, partition_eof=partition_eof,
                                    log_level=log_level, session_timeout_ms=session_timeout_ms,
                                    heartbeat_interval_ms=heartbeat_interval_ms,
                                    max_poll_interval_ms=max_poll_interval_ms))
