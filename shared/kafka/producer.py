"""Protobuf event --> Kafka record, with idempotence and delivery reports.

`enable.idempotence=true` + `acks=all` make librdkafka's retries free of duplicates and keep per-partition
order; the delivery callback is where a caller learns that a record is durable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message
from google.protobuf.message import Message as ProtoMessage

from shared.contracts.topics import contract_name
from shared.contracts.validation import type_headers
from shared.kafka.authorization import report_error
from shared.kafka.client_logs import client_log_config
from shared.kafka.durability import durable_producer
from shared.kafka.security import SecuritySource, librdkafka_config
from shared.kafka.signing import RecordSigner

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]


class DeliveryError(RuntimeError):
    """Records were not confirmed durable in time. Recoverable: the caller still owns them."""


class EventProducer:
    def __init__(self, bootstrap: str, *, client_id: str = "apprentice",
                 extra_config: dict[str, Any] | None = None, security: SecuritySource = None,
                 signer: RecordSigner | None = None) -> None:
        """`security`: TLS/SASL settings (shared/kafka/security.py); None = from the environment.
        `signer`: the principal whose signature every record carries (shared/kafka/trust.py
        `record_signer`); None = unsigned, which consumers refuse unless signatures are off."""
        config: dict[str, Any] = {
            **librdkafka_config(security),
            **client_log_config(bootstrap),
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            # librdkafka retries for this long before reporting a delivery failure.
            "message.timeout.ms": 30000,
        }
        config.update(extra_config or {})
        self._producer = durable_producer(config)     # acks=all and idempotence, never weakened
        self._security = security
        self.signer = signer
        self._lock = threading.Lock()
        self.delivered = 0
        self.failed = 0

    def produce(self, topic: str, key: str | bytes | None, value: ProtoMessage | bytes, *,
                on_delivery: DeliveryCallback | None = None,
                headers: dict[str, str] | None = None) -> None:
        """Queue one record. A protobuf value carries its type in the `apprentice-type` header
        (shared/contracts/validation.py), which consumers check; a bytes value carries only `headers`."""
        if isinstance(value, bytes):
            payload, typed = value, []
        else:
            payload, typed = value.SerializeToString(), type_headers(value)
        k = key.encode() if isinstance(key, str) else key
        all_headers: list[tuple[str, str | bytes | None]] = [*typed, *(headers or {}).items()]
        if self.signer is not None:
            # signed under the contract name: a consumer with another topic prefix checks it the same way
            all_headers = [*self.signer.headers(contract_name(topic) or topic, k, payload, all_headers)]

        def _report(err: KafkaError | None, msg: Message) -> None:
            with self._lock:
                if err is None:
                    self.delivered += 1
                else:
                    self.failed += 1
            # a refusal (no WRITE on the topic): counted, one line naming the command that grants it
            # (shared/kafka/authorization.py); the caller handles the failed delivery as any other
            refused = err is not None and report_error(err, name=topic, operation="WRITE", security=self._security,
                                                       logger=log)
            if err is not None and on_delivery is None and not refused:
                log.error("delivery failed", extra={"topic": topic, "error": str(err)})
            if on_delivery is not None:
                on_delivery(err, msg)

        while True:
            try:
                self._producer.produce(topic, payload, k, on_delivery=_report, headers=all_headers or None)
                break
            except BufferError:
                # Local queue full: serve delivery reports to make room rather than dropping the record.
                self._producer.poll(0.1)
        self._producer.poll(0)

    def poll(self, timeout: float = 0.0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Block until every produced record is acknowledged; raise DeliveryError if some are not."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise DeliveryError(f"{remaining} records not delivered within {timeout:.0f}s")

    def pending(self) -> int:
        return len(self._producer)

    def close(self, timeout: float = 10.0) -> None:
        try:
            self.flush(timeout)
        except DeliveryError as e:
            log.error("closing producer with undelivered records: %s", e)
