"""The `apprentice` entry point's two shared failures: a command that cannot reach the stack ends in one line
instead of a traceback, and a closed pipe ends it quietly.

The entry point (tools/cli/main.py) applies `describe_unreachable` to whatever a command lets through, so a
command written later gets the same line as the ones that word it themselves (shared/unreachable.py).

`apprentice weights status | head -1` closes the pipe before the command has written everything; Python then
raises BrokenPipeError on the next write (or on the final flush at exit). `quiet_stdout` is the standard
answer (Python's documentation, "Note on SIGPIPE"): stdout is pointed at /dev/null so nothing fails again,
and the command exits with EXIT_BROKEN_PIPE, the status a shell reports for a tool ended by SIGPIPE.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error

from shared.settings import CommonSettings
from shared.unreachable import (
    ADDRESS_VARS,
    EXIT_UNREACHABLE,
    KAFKA,
    grpc_unreachable_reason,
    kafka_unreachable,
    unreachable,
)

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_UNREACHABLE", "describe_unreachable", "flush_stdout", "quiet_stdout"]

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what `set -o pipefail` scripts see from any Unix tool whose reader went away."""
COMMAND_SERVICE = {"weights": "weights", "knowledge": "extractor"}
"""The service a command talks to, for an UNAVAILABLE the command did not word itself."""


def _connection_refused(err: BaseException) -> bool:
    """An HTTP (or plain socket) client's "connection refused", bare or wrapped by urllib."""
    if isinstance(err, ConnectionRefusedError):
        return True

    return isinstance(err, urllib.error.URLError) and isinstance(err.reason, ConnectionRefusedError)


def describe_unreachable(err: BaseException, command: str) -> str | None:
    """The one line for an exception of `apprentice <command>` that means a service or the broker did not
    answer; None for anything else (a real bug keeps its traceback)."""
    reason = grpc_unreachable_reason(err)
    if reason is not None:
        service = COMMAND_SERVICE.get(command, "")
        found = re.search(r"(?:ipv4|ipv6|unix):(\S+?)(?::\s|$)", str(getattr(err, "details", lambda: "")() or ""))
        address = found.group(1) if found else os.environ.get(ADDRESS_VARS.get(service, ""), "?")
        return unreachable(service, address, reason)
    if kafka_unreachable(err):
        return unreachable(KAFKA, CommonSettings().kafka_bootstrap)
    if _connection_refused(err):
        return ("a service of the stack refused the connection; start the local stack with `apprentice up` "
                "(or set the command's APPRENTICE_*_ENDPOINT to where it runs)")
    return None


def quiet_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null, so the interpreter's last flush does
    not fail again ("Exception ignored ... BrokenPipeError" on stderr)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test's captured stdout): nothing to redirect
        pass


def flush_stdout() -> bool:
    """Flush stdout now, where a closed pipe can still be handled; False when its reader has gone."""
    try:
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        quiet_stdout()
        return False
