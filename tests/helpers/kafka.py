"""Reading topics in tests and benchmarks (the real broker, no mocks), and a private broker.

Four ways to know you have read enough, one consumer set-up (`consumer`):
- `TopicReader`: reads from the beginning and keeps every record; `wait_for(pred)` until the records
  read so far satisfy a predicate (a test that follows a topic while it acts);
- `collect`: decoded records until given ids (or a count) arrived;
- `read_all`: until an expected count, or until the topic went quiet;
- `read_to_end`: exactly up to the end offsets taken at the start (the chaos checks' exact end).

`private_broker(home)`: a second local broker on free ports, for tests and benchmarks that kill or
restart a broker (the shared one at 9092 is never touched).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer
from google.protobuf.message import Message as ProtoMessage

from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from shared.kafka.consumers import Isolation, new_consumer
from shared.kafka.reader import read_topic_to_end
from shared.kafka.security import KafkaSecurity, SecuritySource
from tools.broker.cluster import LocalCluster
from tools.broker.local_broker import LocalBroker, local_credentials_dir
from tools.stack.ports import below_ephemeral, reserve

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def topic_namespace(bootstrap: str, label: str) -> Iterator[Topics]:
    """A fresh namespace of every contract topic (`test-<label>-<random>.`), deleted afterwards, best effort:
    a slow broker must not fail the module that used it."""
    t = Topics(prefix=f"test-{label}-{uuid.uuid4().hex[:8]}.")
    ensure_topics(bootstrap, t)
    try:
        yield t
    finally:
        with contextlib.suppress(Exception):
            delete_topics(bootstrap, [s.name for s in t.specs()])


def consumer(bootstrap: str, *, group: str = "reader", isolation: Isolation = "read_committed",
             security: SecuritySource = None) -> Consumer:
    """A consumer of its own new group, from the earliest offset, committing nothing (`read_committed`,
    as every Apprentice consumer reads; `read_uncommitted` also shows what aborted transactions wrote):
    shared/kafka/consumers.py's, as every consumer of the code base."""
    return new_consumer(bootstrap, purpose=f"test-{group}", isolation=isolation, security=security)


class TopicReader:
    """Reads a topic from the beginning and keeps everything it has seen."""

    def __init__(self, bootstrap: str, topic: str, *, isolation: Isolation = "read_committed",
                 security: SecuritySource = None) -> None:
        self.topic = topic
        self.c = consumer(bootstrap, isolation=isolation, security=security)
        self.c.subscribe([topic])
        self.records: list[Any] = []

    def poll(self, seconds: float) -> None:
        """Read for `seconds` (also how a test lets a window pass to see that nothing more arrives)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in self.c.consume(500, 0.2):
                if not m.error():
                    self.records.append(m)

    def wait_for(self, pred: Any, timeout: float = 30.0, parse: Any = None) -> list[Any]:
        """Read until `pred(parsed records)` is true or `timeout` passed; return the parsed records (the
        caller asserts on them, so a failure shows what did arrive)."""
        deadline = time.monotonic() + timeout
        while True:
            parsed = [parse(m.value()) if parse else m for m in self.records]
            if pred(parsed) or time.monotonic() > deadline:
                return parsed
            self.poll(0.3)

    def close(self) -> None:
        self.c.close()


def collect(bootstrap: str, topic: str, msg_type: type[ProtoMessage], *, want: Iterable[str] = (),
            key: Callable[[Any], str] = lambda m: m.interaction_id, count: int | None = None,
            timeout: float = 30.0) -> list[Any]:
    """Decoded records of `topic` from the beginning, until every id in `want` (by `key`) or `count`
    records arrived, or `timeout`. Returns every record read."""
    wanted = set(want)
    c = consumer(bootstrap, group="collect")
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            ev = msg_type()
            ev.ParseFromString(m.value())
            out.append(ev)
            wanted.discard(key(ev))
            if (count is not None and len(out) >= count) or (count is None and not wanted and want):
                break
    finally:
        c.close()
    return out


def read_all(bootstrap: str, topic: str, *, expect: int | None = None, timeout: float = 20.0,
             idle: float = 2.0, security: SecuritySource = None) -> list[Message]:
    """Every record on `topic` from the beginning. Returns once `expect` records arrived, or after `idle`
    seconds without a new record (when `expect` is None), or at `timeout`."""
    c = consumer(bootstrap, group="read-all", security=security)
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


def read_to_end(bootstrap: str, topic: str, timeout: float = 120.0) -> list[Any]:
    """Every record on `topic` up to its end as of now, duplicates included (shared/kafka/reader.py: an
    end that is exact, unlike waiting for the topic to go quiet, and that steps over transaction markers)."""
    return list(read_topic_to_end(bootstrap, topic, purpose="test-read-to-end", timeout_s=timeout))


# --- a private broker ------------------------------------------------------------------------------
def link_broker_jars(home: Path) -> None:
    """Make a broker under `home` reuse the jars of the usual local broker (symlinked), so no Maven run
    is needed when `apprentice kafka start` ran once on this machine."""
    from shared.settings import CommonSettings

    libs_link = home / "kafka" / "libs"
    for libs in (CommonSettings().home / "kafka" / "libs", REPO_ROOT / ".apprentice" / "kafka" / "libs"):
        if (libs / ".complete").exists() and not libs_link.exists():
            libs_link.parent.mkdir(parents=True, exist_ok=True)
            libs_link.symlink_to(libs.resolve(), target_is_directory=True)


def _share_jars_and_credentials(home: Path) -> None:
    """The local jars (no Maven run) and the session broker's credentials folder, linked under `home`."""
    link_broker_jars(home)
    held = local_credentials_dir(os.environ)
    link = home / "kafka" / "sasl"
    if held is not None and not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(held.resolve(), target_is_directory=True)


def private_broker(home: Path, **options: Any) -> LocalBroker:
    """A LocalBroker (not started) on free ports with its data under `home`, reusing the local jars and the
    session broker's credentials (tests/conftest.py): the same admin and principals' passwords, so this
    process (admin, from its environment) and a stack's services reach either broker alike."""
    _share_jars_and_credentials(home)
    for _ in range(200):
        port = below_ephemeral(2)           # restarted on the same port (chaos): not an ephemeral one
        if port_free(port) and port_free(port + 1):
            reserve(port, port + 1)
            return LocalBroker(home, port=port, controller_port=port + 1, **options)
    raise RuntimeError("no free ports for a private broker")


def private_cluster(home: Path, brokers: int = 3) -> LocalCluster:
    """A LocalCluster (not started) of `brokers` nodes on free port ladders, data under `home`, reusing the local
    jars and the session broker's credentials (as `private_broker`)."""
    from tools.broker.local_broker import PORT_STEP
    _share_jars_and_credentials(home)
    for _ in range(200):
        # below the ephemeral range: a killed node's port must still be free when it restarts
        base = below_ephemeral(PORT_STEP * brokers)
        ports = [base + PORT_STEP * i + d for i in range(brokers) for d in (0, 1)]
        if all(port_free(p) for p in ports):
            reserve(*ports)                 # the stack's services pick their ports after this
            return LocalCluster(home, brokers, port=base, heap="384m")
    raise RuntimeError("no free ports for a cluster")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def produce_one(bootstrap: str, security: KafkaSecurity, topic: str) -> KafkaError | None:
    """Produce one record as `security`'s principal; the delivery error (None when it was written): how
    the access tests see what the broker's ACLs allow."""
    errors: list[KafkaError | None] = []
    p = Producer({**security.librdkafka(), "bootstrap.servers": bootstrap, "message.timeout.ms": 15000})
    p.produce(topic, b"x", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(30)
    assert len(errors) == 1, "no delivery report"
    return errors[0]
