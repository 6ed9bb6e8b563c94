"""One line instead of a traceback when a CLI command cannot reach the stack, and a quiet exit into a closed pipe.

With the stack down, every client command used to end in gRPC's raw UNAVAILABLE text ("failed to connect to
all addresses; last error: UNKNOWN: ipv4:...") or in a Kafka or socket traceback: neither says which service
was meant nor what to do about it. `unreachable` words it once for every command (the weights and knowledge
CLIs, `topics`, `tail`), and the entry point (tools/cli/main.py) applies `describe_unreachable` to whatever a
command lets through, so a command written later gets the same line without knowing about it.

`apprentice weights status | head -1` closes the pipe before the command has written everything; Python then
raises BrokenPipeError on the next write (or on the final flush at exit). `quiet_stdout` is the standard
answer (Python's documentation, "Note on SIGPIPE"): stdout is pointed at /dev/null so nothing fails again,
and the command exits with EXIT_BROKEN_PIPE, the status a shell reports for a tool ended by SIGPIPE.
"""

from __future__ import annotations

import os
import re
import sys

from shared.contracts.stack_endpoints import GRPC_TARGET_VARS

EXIT_UNREACHABLE = 3
"""A service (or the broker) did not answer: the weights CLI's documented code, now every command's."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what `set -o pipefail` scripts see from any Unix tool whose reader went away."""

KAFKA = "kafka"
"""`unreachable`'s name for the Kafka broker."""
ADDRESS_VARS = {**GRPC_TARGET_VARS, KAFKA: "APPRENTICE_KAFKA_BOOTSTRAP"}
COMMAND_SERVICE = {"weights": "weights", "knowledge": "extractor"}
"""The service a command talks to, for an UNAVAILABLE the command did not word itself."""
_CONNECT_FAILURES = ("failed to connect", "connection refused", "dns resolution failed", "name resolution",
                     "no route to host", "network is unreachable", "connect failed")
_TLS_FAILURES = ("handshake", "ssl", "certificate")


def unreachable(service: str, address: str, reason: str = "") -> str:
    """The one line for "`service` at `address` does not answer": which one, where, and how to start it
    or point the command elsewhere (the variable that names its address)."""
    what = "the Kafka broker" if service == KAFKA else f"the {service} service" if service else "the service"
    var = ADDRESS_VARS.get(service)
    how = "start the local stack with `apprentice up`" + (f" (or set {var} to where it runs)" if var else "")
    return f"{what} at {address} is not answering{f' ({reason})' if reason else ''}; {how}"


def grpc_unreachable_reason(err: BaseException) -> str | None:
    """Why a gRPC call did not reach its server ("connection refused"), or None when it did: a server's own
    UNAVAILABLE (a busy store, a draining pod) is an answer, and a TLS failure means something does listen
    there (the CA or the scheme is wrong), so neither is worded as "not answering"."""
    import grpc

    code = getattr(err, "code", None)
    if not isinstance(err, grpc.RpcError) or not callable(code) or code() != grpc.StatusCode.UNAVAILABLE:
        return None
    details = str(getattr(err, "details", lambda: "")() or "")
    low = details.lower()
    if any(m in low for m in _TLS_FAILURES) or not any(m in low for m in _CONNECT_FAILURES):
        return None
    return details.rsplit(": ", 1)[-1].strip().lower() or "unavailable"


def kafka_unreachable(err: BaseException) -> bool:
    """Whether a Kafka client error means that no broker answered (down, refused, unresolvable, timed out)."""
    try:
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:  # pragma: no cover - a build without the Kafka client
        return False
    if not isinstance(err, KafkaException) or not err.args or not isinstance(err.args[0], KafkaError):
        return False
    return err.args[0].code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                                  KafkaError._TIMED_OUT)


def _connection_refused(err: BaseException) -> bool:
    """An HTTP (or plain socket) client's "connection refused", bare or wrapped by urllib."""
    if isinstance(err, ConnectionRefusedError):
        return True
    import urllib.error

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
        from shared.settings import CommonSettings

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
