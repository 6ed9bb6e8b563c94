"""Helpers for tests and benchmarks that read a topic to its end (real broker, no mocks)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Message

from shared.kafka.security import SecuritySource, librdkafka_config


def read_all(bootstrap: str, topic: str, *, expect: int | None = None, timeout: float = 20.0,
             idle: float = 2.0, security: SecuritySource = None) -> list[Message]:
    """Every record on `topic` from the beginning. Returns once `expect` records arrived, or after `idle`
    seconds without a new record (when `expect` is None), or at `timeout`."""
    c = Consumer({**librdkafka_config(security), "bootstrap.servers": bootstrap,
                  "group.id": f"read-all-{uuid.uuid4()}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append(m)
                last = time.monotonic()
                if expect is not None and len(out) >= expect:
                    break
            elif expect is None and out and time.monotonic() - last > idle:
                break
    finally:
        c.close()
    return out
