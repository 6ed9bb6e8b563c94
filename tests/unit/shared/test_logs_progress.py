"""One log format per stream (JSON to files and pipes, text to a terminal) and progress bars only where a
person watches a terminal with text logs: never a bar or an ANSI escape in a JSON log."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from shared import logs
from shared.progress import progress, progress_enabled


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("APPRENTICE_PROGRESS", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._json_active = False


def test_format_follows_the_stream_unless_configured() -> None:
    assert logs.wants_json(None, io.StringIO()) is True       # a file or pipe: JSON
    assert logs.wants_json(None, _Tty()) is False             # a terminal: text
    assert logs.wants_json(True, _Tty()) is True              # APPRENTICE_LOG_JSON wins
    assert logs.wants_json(False, io.StringIO()) is False


def test_configure_logging_on_a_terminal_writes_text(monkeypatch: pytest.MonkeyPatch) -> None:
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    logs.configure_logging("svc", "INFO", None)
    logging.getLogger("x").info("hello %s", "there")
    assert not logs.json_logs_active()
    line = tty.getvalue().strip()
    assert line.endswith("svc INFO x: hello there") and not line.startswith("{")


def test_json_logs_hold_no_ansi_escape_and_disable_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Tty()   # even on a terminal, when JSON is asked for
    monkeypatch.setattr("sys.stderr", out)
    logs.configure_logging("svc", "INFO", True)
    logging.getLogger("x").warning("\x1b[31mred\x1b[0m 50%|#####     | 5/10\r")
    record = json.loads(out.getvalue().strip())
    assert record["msg"] == "red 50%|#####     | 5/10" and record["service"] == "svc"
    assert not progress_enabled(out)
    bar = progress(range(3), desc="x", stream=out)
    assert list(bar) == [0, 1, 2]
    assert out.getvalue().count("\n") == 1                    # the log line only: no bar was drawn


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe, tty = io.StringIO(), _Tty()
    assert not progress_enabled(pipe) and progress_enabled(tty)
    for _ in progress(range(5), desc="steps", unit="step", stream=pipe):
        pass
    assert pipe.getvalue() == ""
    with progress(total=4, desc="steps", unit="step", stream=tty) as bar:
        bar.update(4)
    drawn = tty.getvalue()
    assert "steps" in drawn and "4/4" in drawn and "step/s" in drawn          # count and rate (and ETA while running)
    monkeypatch.setenv("APPRENTICE_PROGRESS", "0")
    assert not progress_enabled(tty)
    monkeypatch.setenv("APPRENTICE_PROGRESS", "1")
    assert progress_enabled(pipe)


def test_noisy_libraries_repeat_at_most_every_30_s(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    logs.configure_logging("svc", "INFO", True)
    noisy, ours = logging.getLogger("aiokafka.conn"), logging.getLogger("services.x")
    for i in range(50):
        noisy.error("Unable connect to node with id %s", i)
        ours.warning("our own line %s", i)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["msg"] for r in lines if r["logger"] == "aiokafka.conn"] == ["Unable connect to node with id 0"]
    assert sum(r["logger"] == "services.x" for r in lines) == 50      # the services' own lines are never dropped
    later = logging.LogRecord("aiokafka.conn", logging.ERROR, "", 0, "Unable connect to node with id %s", (9,), None)
    later.created += logs.REPEAT_S
    assert logging.getLogger().handlers[0].filter(later)
