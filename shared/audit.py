"""Operator action + caller identity --> an `AuditRecord` on `apprentice.audit.v1`, durable before the
action takes effect.

Every action that changes what is served or what trains (promote, force, canary, rollback, pin, knowledge
approve/reject/edit/pin), and every such attempt that was refused, leaves a record naming who did it. The
write is synchronous: a service applies an action only after its record is acknowledged, so an action
without a trace cannot happen; when Kafka is down the action fails with a retryable error.

The producer a service passes must sign as that service (shared/kafka/trust.py `record_signer`; the weights
and extractor services are the audit topic's writers, shared/contracts/topic_access.py): an unsigned
audit record is evidence nobody can attribute, and a reader checking signatures refuses it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping

from confluent_kafka import KafkaError, Message

from shared.contracts.events import make_envelope
from shared.contracts.topics import Topics
from shared.kafka.producer import DeliveryError, EventProducer
from shared.proto.apprentice.v1 import events_pb2
from shared.rpc.grpc_util import Unavailable
from shared.security.identity import ANONYMOUS, Identity, current_identity

log = logging.getLogger(__name__)

MAX_TARGET = 512
MAX_FIELD = 2000
MAX_DETAILS = 32


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"

SYSTEM_TENANT = "_system"
"""Tenant of records about actions that apply to every tenant (an operator's base model)."""


class AuditLog:
    def __init__(self, producer: EventProducer, topics: Topics, *, source: str, timeout_s: float = 15.0) -> None:
        self._producer = producer
        self._topic = topics.audit
        self._source = source
        self._timeout_s = timeout_s
        if producer.signer is None:
            log.warning("audit records of %s are written unsigned (record signatures off?): readers that check "
                        "signatures refuse them", source)

    def record(self, action: str, target: str, *, tenant: str = "", allowed: bool = True, reason: str = "",
               details: Mapping[str, str] | None = None, identity: Identity | None = None) -> events_pb2.AuditRecord:
        """Write one record and wait until it is durable; raise `Unavailable` (UNAVAILABLE) if it is not."""
        who = identity or current_identity() or ANONYMOUS
        env = make_envelope(tenant or SYSTEM_TENANT, source=self._source)
        env.principal.CopyFrom(who.to_principal())
        # Bounded: the fields may quote a caller's input, and a record the broker refuses would fail the
        # action for the wrong reason (an audit record is evidence, not a copy of the request).
        target = _clip(target, MAX_TARGET)
        rec = events_pb2.AuditRecord(envelope=env, action=action, target=target, allowed=allowed,
                                     reason=_clip(reason, MAX_FIELD),
                                     details={_clip(k, 100): _clip(str(v), MAX_FIELD)
                                              for k, v in list((details or {}).items())[:MAX_DETAILS]})
        done = threading.Event()
        errors: list[KafkaError] = []

        def _delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)
            done.set()

        self._producer.produce(self._topic, target, rec, on_delivery=_delivered)
        with contextlib.suppress(DeliveryError):   # reported below, with a reason
            self._producer.flush(self._timeout_s)
        if not done.wait(0) or errors:
            why = str(errors[0]) if errors else f"not acknowledged within {self._timeout_s:.0f}s"
            raise Unavailable(f"audit record for {action} {target} not written ({why}); nothing was changed")
        log.info("audit", extra={"action": action, "target": target, "allowed": allowed,
                                 "actor": f"{who.role.value}:{who.key_id}"})
        return rec
