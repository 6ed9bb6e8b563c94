"""librdkafka's own logs and errors --> a few clear lines through Python logging.

Left alone, librdkafka writes its log lines straight to stderr: a service whose broker is down writes
one per reconnect attempt per client, over a thousand in a minute and a half, none of which says what to
do. Every confluent-kafka client built by shared/kafka gets `client_log_config(bootstrap)`, which routes:

- errors (`error_cb`): an unreachable broker becomes one line, "Kafka broker unreachable at X (reason);
  retrying", at most once per 30 s per bootstrap address in the whole process (every client of a process
  reports the same outage); an authorization refusal (the idempotent producer's cluster right) the line of
  shared/kafka/authorization.py, counted; other errors one line per error code per 30 s;
- log lines (`logger`): through the `librdkafka` Python logger, at most one per facility per 30 s, with
  the number of lines suppressed since, so they land in the service's log, never raw on stderr (lines
  about a failed connection are dropped: the error line above says it once).

The limiter is process-wide and thread-safe: librdkafka calls back from whichever thread polls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from shared.kafka.authorization import report_error
from shared.kafka.rate_limit import INTERVAL_S, RateLimiter

log = logging.getLogger("librdkafka")

UNREACHABLE_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})

DUPLICATE_FACILITIES = frozenset({"FAIL", "ERROR"})
"""Log facilities whose lines repeat what `error_cb` reports (a failed connection): dropped."""


LIMITER = RateLimiter()


def unreachable_message(bootstrap: str, reason: str) -> str:
    return f"Kafka broker unreachable at {bootstrap} ({reason}); retrying"


def _held(n: int) -> str:
    return f" [{n} similar suppressed in the last {INTERVAL_S:.0f}s]" if n else ""


class _LibrdkafkaLogger:
    """What confluent-kafka's `logger` option calls: `.log(level, fmt, *args)` with a syslog level."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    def log(self, level: int, msg: str, *args: Any) -> None:
        """`level` is already a Python level (confluent-kafka maps librdkafka's syslog levels);
        `args` = (facility, client name, text)."""
        args_ = tuple(args)
        facility = str(args_[0]) if args_ else "log"
        if facility in DUPLICATE_FACILITIES:
            return
        held = self.limiter.allow(f"log:{facility}")
        if held is None:
            return
        text = msg % args_ if args_ else msg
        log.log(level, "%s%s", text, _held(held))


def error_callback(bootstrap: str, limiter: RateLimiter | None = None) -> Callable[[KafkaError], None]:
    """`error_cb` for a client of `bootstrap`."""
    lim = limiter or LIMITER

    def on_error(err: KafkaError) -> None:
        code = err.code()
        if report_error(err):     # a refusal (the idempotent producer's cluster right, fatal): its own line
            return
        if code in UNREACHABLE_CODES:
            held = lim.allow(f"unreachable:{bootstrap}")
            if held is not None:
                log.error("%s%s", unreachable_message(bootstrap, err.str()), _held(held),
                          extra={"kafka_bootstrap": bootstrap, "kafka_error": err.name()})
            return
        held = lim.allow(f"error:{bootstrap}:{code}")
        if held is not None:
            log.log(logging.ERROR if err.fatal() else logging.WARNING, "Kafka client error at %s: %s%s",
                    bootstrap, err.str(), _held(held), extra={"kafka_error": err.name()})

    return on_error


def client_log_config(bootstrap: str, limiter: RateLimiter | None = None) -> dict[str, Any]:
    """librdkafka configuration keys that route its logs and errors as described above."""
    lim = limiter or LIMITER
    return {"logger": _LibrdkafkaLogger(lim), "error_cb": error_callback(bootstrap, lim)}
