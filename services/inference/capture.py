"""(topic, key, event) from request threads --> spool (write-ahead) --> Kafka, on one background thread.

Off the Kafka path: `submit` only enqueues and returns a `Spooled` ticket. The worker appends each event to
the on-disk spool (and sets the ticket), then
feeds the spool to an idempotent producer (at most `max_inflight` unacknowledged records at a time),
and removes a record from the spool once Kafka acknowledged it. While the broker is down, librdkafka
keeps the in-flight records and retries them in order; everything after them waits on disk, so the
outage costs disk space, not memory, and no request ever waits or fails on it. When the spool is full,
new events are dropped with an alarm (metric `..._capture_dropped_total`, `..._spool_full`, an error
log), never a failed request.

Exactly once on the topic: a record is produced again only if its delivery *failed* (librdkafka gave up
after `delivery_timeout_ms`, or a retriable error), and only after every in-flight record has reported;
event ids are deterministic, so a consumer that sees a repeat after a crash can dedupe by event id.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import Any

from confluent_kafka import KafkaError
from google.protobuf.message import Message as ProtoMessage

from services.inference import metrics
from services.inference.spool import Spool, SpoolRecord
from shared.contracts.topics import contract_name
from shared.contracts.validation import type_headers_for_topic
from shared.kafka.client_logs import client_log_config
from shared.kafka.durability import durable_producer
from shared.kafka.security import SecuritySource, librdkafka_config
from shared.kafka.signing import RecordSigner
from shared.retry import Backoff

log = logging.getLogger(__name__)

# Errors that retrying the same bytes will never fix: the record is dropped (logged + counted).
_PERMANENT = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG, KafkaError.TOPIC_AUTHORIZATION_FAILED,
              KafkaError._INVALID_ARG, KafkaError.INVALID_RECORD}


class Spooled:
    """Set by the capture worker once the event is in the spool (`ok`) or was dropped (not `ok`)."""

    __slots__ = ("_done", "ok")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.ok = False

    def _settle(self, ok: bool) -> None:
        self.ok = ok
        self._done.set()

    def wait(self, timeout: float) -> bool:
        """True when the event is on disk within `timeout` seconds."""
        return self._done.wait(timeout) and self.ok


class CaptureSink:
    def __init__(self, bootstrap: str, spool: Spool, *, client_id: str = "apprentice-inference",
                 max_inflight: int = 2000, delivery_timeout_ms: int = 0, max_queue: int = 100_000,
                 stall_s: float = 5.0, security: SecuritySource = None,
                 signer: RecordSigner | None = None) -> None:
        """`security`: Kafka TLS/SASL settings (shared/kafka/security.py); None = from the environment.
        `signer`: the inference principal's record signer (shared/kafka/trust.py `record_signer`): every
        record is signed when it is sent (the spool keeps the bare bytes), so the grader and the other
        consumers accept interactions and feedback only from inference; None = unsigned."""
        self.spool = spool
        self.signer = signer
        self.max_inflight = max_inflight
        self.stall_s = stall_s
        # Idempotent + acks=all as every Apprentice producer (docs/architecture.md §5); our own client rather than
        # shared EventProducer because the sink must purge what it handed over when it closes.
        self._producer = durable_producer({
            **librdkafka_config(security), **client_log_config(bootstrap),
            "bootstrap.servers": bootstrap, "client.id": client_id, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "compression.type": "lz4",
            "message.timeout.ms": delivery_timeout_ms,
            "queue.buffering.max.messages": max(10 * max_inflight, 100_000),
            "reconnect.backoff.max.ms": 1000,
            "log_level": 2,   # the broker may be down for a while: connection errors are expected, not logged
        })
        self._queue: queue.Queue[tuple[str, bytes, Any, Spooled]] = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capture", daemon=True)
        self._inflight = 0
        self._retry: SpoolRecord | None = None
        self._failed = False
        self._last_ack = time.monotonic()
        self._backoff_until = 0.0
        self._backoff = Backoff(0.5, 10.0)   # between re-sends from the spool after a failed delivery
        self._last_alarm = 0.0
        self._full = False
        self.delivered = 0
        self.dropped = 0
        self._idle = threading.Event()

    def start(self) -> CaptureSink:
        self._thread.start()
        return self

    # --- request side -----------------------------------------------------------------------------
    def submit(self, topic: str, key: str, event: ProtoMessage | bytes) -> Spooled:
        """Enqueue an event for delivery; never blocks, never raises (a full queue is an alarm). The ticket
        tells a caller that must acknowledge durably when the event reached the spool."""
        ticket = Spooled()
        try:
            self._queue.put_nowait((topic, key.encode(), event, ticket))
            self._idle.clear()
        except queue.Full:
            self._drop("capture queue full")
            ticket._settle(False)
        return ticket

    # --- worker -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._step(wait=0.02)
        # drain what request threads already handed over into the spool
        self._step(wait=0.0)

    def _step(self, wait: float) -> None:
        # Block on the queue, not in librdkafka: a submitted event is spooled as soon as it arrives (a caller
        # waits on its ticket), and delivery reports are served every 5 ms while records are in flight.
        self._spool_queued(min(wait, 0.005) if self._inflight else wait)
        self._pump()
        self._producer.poll(0)
        self._recover_failures()
        self._update_gauges()
        if self._queue.empty() and self.spool.depth == 0:
            self._idle.set()

    def _spool_queued(self, wait: float) -> None:
        try:
            first = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            return
        items = [first]
        while len(items) < 1000:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        settled: list[tuple[Spooled, bool]] = []
        for topic, key, event, ticket in items:
            value = event if isinstance(event, bytes) else event.SerializeToString()
            if self.spool.append(topic, key, value) is None:
                self._drop("spool full")
                settled.append((ticket, False))
                continue
            settled.append((ticket, True))
            if self._full:
                self._full = False
                metrics.SPOOL_FULL.set(0)
                log.warning("capture: spool accepts events again", extra={"dropped_total": self.dropped})
        self.spool.flush()                  # in the OS's hands: a crash of this process no longer loses it
        for ticket, ok in settled:
            ticket._settle(ok)

    def _pump(self) -> None:
        if self._failed or time.monotonic() < self._backoff_until:
            return
        while self._inflight < self.max_inflight:
            rec, self._retry = self._retry or self.spool.next_record(), None
            if rec is None:
                return
            try:
                # The value's type in a header (shared/contracts/validation.py), from the topic: the spool keeps bytes.
                headers: Any = type_headers_for_topic(rec.topic)
                if self.signer is not None:
                    headers = self.signer.headers(contract_name(rec.topic) or rec.topic, rec.key, rec.value,
                                                  headers)
                self._producer.produce(rec.topic, rec.value, rec.key, headers=headers,
                                       on_delivery=functools.partial(self._on_delivery, rec.seq, rec.topic))
            except BufferError:       # librdkafka's queue is full: this record goes first next time
                self._retry = rec
                return
            self._inflight += 1

    def _on_delivery(self, seq: int, topic: str, err: KafkaError | None, _msg: Any) -> None:
        self._inflight -= 1
        if err is None:
            self._last_ack = time.monotonic()
            self.spool.ack(seq)
            self.delivered += 1
            self._backoff.reset()
            metrics.CAPTURED.labels(topic=topic).inc()
            return
        if err.code() in _PERMANENT:
            log.error("capture: record rejected permanently, dropped", extra={"topic": topic, "error": str(err)})
            self.spool.ack(seq)
            self.dropped += 1
            metrics.CAPTURE_DROPPED.inc()
            return
        if not self._failed:
            log.warning("capture: delivery failed, will re-send from the spool",
                        extra={"topic": topic, "error": str(err)})
        self._failed = True

    def _recover_failures(self) -> None:
        if self._failed and self._inflight == 0:
            self._retry = None
            self.spool.rewind()
            self._failed = False
            self._backoff_until = time.monotonic() + self._backoff.next()

    def _update_gauges(self) -> None:
        stalled = self._inflight > 0 and time.monotonic() - self._last_ack > self.stall_s
        metrics.CAPTURE_BROKER_UP.set(0 if (stalled or self._failed) else 1)
        metrics.SPOOL_DEPTH.set(self.spool.depth)
        metrics.SPOOL_BYTES.set(self.spool.bytes)

    def _drop(self, why: str) -> None:
        self._full = True
        self.dropped += 1
        metrics.CAPTURE_DROPPED.inc()
        metrics.SPOOL_FULL.set(1)
        now = time.monotonic()
        if now - self._last_alarm > 10.0:
            self._last_alarm = now
            log.error("capture: event dropped (%s); the interaction will be missing from training data", why,
                      extra={"spool_bytes": self.spool.bytes, "spool_depth": self.spool.depth,
                             "dropped_total": self.dropped})

    # --- control ----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Events accepted and not yet acknowledged by Kafka (queued in memory or spooled)."""
        return self._queue.qsize() + self.spool.depth

    def wait_idle(self, timeout: float) -> bool:
        """True once every submitted event is acknowledged (tests, benchmarks, graceful stop)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._idle.wait(0.05) and self._queue.empty() and self.spool.depth == 0:
                return True
        return False

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what can be delivered within `timeout`; the rest stays in the spool for the next start."""
        self.wait_idle(timeout)
        self._stop.set()
        self._thread.join(timeout=5.0)
        # Records still inside librdkafka stay in the spool; purge them so this client cannot deliver them
        # after the next start re-sends them from the spool.
        self._producer.purge()
        self._producer.poll(0)
        self._producer.flush(0)
        left = self.spool.depth
        if left:
            log.warning("capture: %d events stay in the spool for the next start", left)
        self.spool.close()
