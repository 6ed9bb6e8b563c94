"""Structured logging: one JSON object per line with service, trace id and any `extra=` fields."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime

trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")

_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


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
            "msg": record.getMessage(),
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


def configure_logging(service: str, level: str = "INFO", json_format: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if json_format
                         else logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "urllib3", "filelock", "aiokafka", "faust", "mode"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
