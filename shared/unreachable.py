"""One line instead of a traceback when a client command cannot reach a service or the broker.

With the stack down, every client command used to end in gRPC's raw UNAVAILABLE text ("failed to connect to
all addresses; last error: UNKNOWN: ipv4:...") or in a Kafka or socket traceback: neither says which service
was meant nor what to do about it. `unreachable` words it once for every command: the operator commands
that live with their service (services/weights/cli.py, services/extractor/cli.py, services/grader/cli.py)
and the `apprentice` entry point's own (tools/cli/), which applies it to whatever a command lets through
(tools/cli/failures.py).
"""

from __future__ import annotations

import grpc

from shared.contracts.stack_endpoints import GRPC_TARGET_VARS

EXIT_UNREACHABLE = 3
"""A service (or the broker) did not answer: the weights CLI's documented code, now every command's."""

KAFKA = "kafka"
"""`unreachable`'s name for the Kafka broker."""
ADDRESS_VARS = {**GRPC_TARGET_VARS, KAFKA: "APPRENTICE_KAFKA_BOOTSTRAP"}
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
        # optional: this module also serves builds without the Kafka client
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:  # pragma: no cover - a build without the Kafka client
        return False
    if not isinstance(err, KafkaException) or not err.args or not isinstance(err.args[0], KafkaError):
        return False
    return err.args[0].code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                                  KafkaError._TIMED_OUT)
