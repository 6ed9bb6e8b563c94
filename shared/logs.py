"""Logging: one format per stream. JSON objects per line (service, trace id, `extra=` fields) where a
program reads them (a log file, a pipe, a collector), human-readable lines where a person reads them (a
terminal). Progress bars (shared/progress.py) draw only on a terminal with human-readable logs, so JSON
logs never hold a bar or an ANSI escape."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from datetime import UTC, datetime

trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")

_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\r")
_json_active = False


def json_logs_active() -> bool:
    """Whether this process logs JSON lines (then nothing may draw on its stderr)."""
    return _json_active


def wants_json(json_format: bool | None, stream: object = None) -> bool:
    """`json_format` as configured; None (unset) = JSON unless the stream is a terminal."""
    if json_format is not None:
        return json_format
    isatty = getattr(stream if stream is not None else sys.stderr, "isatty", None)
    return not (callable(isatty) and isatty())


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, str | int | float | bool | None] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": _ANSI.sub("", record.getMessage()),
        }
        trace = getattr(record, "trace_id", "") or trace_id_var.get()
        if trace:
            out["trace_id"] = trace
        for k, v in vars(record).items():
            if k not in _STD_ATTRS and k not in out:
                out[k] = v if isinstance(v, str | int | float | bool | type(None)) else str(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


NOISY = ("httpx", "urllib3", "filelock", "aiokafka", "faust", "mode")
"""Libraries that log every retry of a broken connection: warnings only, each message at most once per
REPEAT_S (librdkafka's own lines are limited where its clients are built: shared/kafka/client_logs.py)."""
REPEAT_S = 30.0


class RepeatLimiter(logging.Filter):
    """Passes a record of a NOISY library only if the same message (logger + format string) has not
    passed within `interval_s`: an outage is one line per 30 s, not one per reconnect attempt."""

    def __init__(self, interval_s: float = REPEAT_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(NOISY):
            return True
        key = (record.name, str(record.msg))
        last = self._last.get(key)
        if last is not None and record.created - last < self.interval_s:
            return False
        self._last[key] = record.created
        return True


def configure_logging(service: str, level: str = "INFO", json_format: bool | None = True) -> None:
    """`json_format`: True/False as configured (APPRENTICE_LOG_JSON), None = by the stream (JSON unless
    stderr is a terminal)."""
    global _json_active
    handler = logging.StreamHandler(sys.stderr)
    _json_active = wants_json(json_format, sys.stderr)
    handler.setFormatter(JsonFormatter(service) if _json_active
                         else logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RepeatLimiter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
