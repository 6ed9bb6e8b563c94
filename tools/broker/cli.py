"""`apprentice kafka|topics|tail`: manage the local broker and look inside topics."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from shared.contracts import topic_access as access
from shared.contracts.events import UndecodableEvent, decode, message_type, to_dict
from shared.contracts.topics import EVENT_TOPICS, Topics
from shared.kafka.admin import admin, broker_answers, ensure_topics, list_topics
from shared.kafka.authorization import KafkaAccessDenied, denied
from shared.kafka.consumers import new_consumer, private_group
from shared.kafka.grants import PrefixClash
from shared.kafka.trust import RecordTrust
from shared.settings import CommonSettings
from shared.startup import EXIT_STARTUP_ERROR
from shared.unreachable import EXIT_UNREACHABLE, KAFKA, unreachable
from tools.broker.acls import apply_acls, describe_acls, grants, table_lines
from tools.broker.cluster import LocalCluster
from tools.broker.local_broker import (
    DEFAULT_PLAINTEXT_PORT,
    DEFAULT_PORT,
    BrokerError,
    LocalBroker,
    local_credentials_dir,
    principal_security,
)

if TYPE_CHECKING:
    from tools.broker.local_broker import BrokerStatus

SHARE_ENV = "APPRENTICE_USE_RUNNING_BROKER"
"""Set to 1: `apprentice up` shares a broker of another home that answers at its address (as
`--use-running-broker`)."""


def _broker(settings: CommonSettings, *, plaintext_port: int | None = None) -> LocalBroker:
    return LocalBroker.for_settings(settings, plaintext_port=plaintext_port)


def whose(st: BrokerStatus) -> str:
    """The answering broker in words: the home it belongs to (and its pid) when it is another home's local
    broker, else the data folder it reports."""
    if st.serving_home is not None:
        pid = st.serving_pid
        return (f"the broker of {st.serving_home}" + (f" (pid {pid})" if pid else "")
                + f", data {st.serving_data_dir}")
    if st.serving_data_dir is not None:
        return f"a broker with its data in {st.serving_data_dir}"
    if st.refuses_admin:
        return "a broker that refuses this home's admin credentials (another home's, or one started before authorization)"
    return "a broker this home did not start (it does not say where its data is)"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def foreign_broker(settings: CommonSettings) -> str | None:
    """Why `apprentice up` must not use the broker at its configured address unless asked to share: a
    broker answers on this machine there, but it is not this home's (another checkout's, typically on
    9092), so this stack would write into a data folder `kafka status` did not name. None when the broker
    is this home's, none answers (`up` starts one), or the address is another machine's (a cluster the
    user pointed at on purpose)."""

    try:
        if LocalCluster.recorded(settings.home) is not None:
            return None                   # this home's own cluster
        broker = _broker(settings)
    except BrokerError:
        return None                       # `kafka start` says what is wrong with the settings
    if not _loopback(broker.host):
        return None
    st = broker.status()
    if not st.foreign:
        return None
    stop = f"APPRENTICE_HOME={st.serving_home} apprentice kafka stop" if st.serving_home else "stop it"
    return (f"the Kafka broker at {st.bootstrap} is not this home's ({settings.home}): it is {whose(st)}. "
            f"Stop it ({stop}), give this home a broker of its own on another port "
            f"(APPRENTICE_KAFKA_BOOTSTRAP=127.0.0.1:29092), or share it: --use-running-broker (or {SHARE_ENV}=1)")


def kafka(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice kafka", description="The local single-node KRaft broker: "
                                 "SASL only, every client authenticated, every request authorized (SECURITY.md).")
    ap.add_argument("action", choices=["start", "stop", "status", "fetch", "acls", "rotate"],
                    help="acls: print the access table, or --apply / --describe the ACLs of a deployment; "
                         "rotate: a new password for --principal")
    ap.add_argument("--no-topics", action="store_true", help="do not create the Apprentice topics on start")
    ap.add_argument("--plaintext-listener", action="store_true",
                    help="INSECURE: also serve a plain listener on --plaintext-port where any client, without "
                         "credentials, may read and write every topic (legacy clients on a trusted machine only)")
    ap.add_argument("--plaintext-port", type=int, default=DEFAULT_PLAINTEXT_PORT,
                    help=f"port of the plain listener (default {DEFAULT_PLAINTEXT_PORT})")
    ap.add_argument("--prefix", default=None,
                    help="acls: the deployment's topic prefix (default: APPRENTICE_TOPIC_PREFIX)")
    ap.add_argument("--apply", action="store_true", help="acls: create the missing SCRAM users and ACLs")
    ap.add_argument("--describe", action="store_true", help="acls: print the ACLs the broker holds")
    ap.add_argument("--principal", choices=[*access.PRINCIPALS, access.ADMIN], help="rotate: whose password")
    ap.add_argument("--brokers", type=int, default=None, metavar="N",
                    help="start: a replicated cluster of N brokers (3: replication factor 3, min.insync.replicas "
                         "2; tools/broker/cluster.py); stop and status act on the cluster this home recorded")
    ns = ap.parse_args(argv)
    settings = CommonSettings()
    if ns.brokers is not None and ns.brokers < 1:
        ap.error("--brokers must be at least 1")

    try:
        cluster = _cluster(settings, ns.brokers)
        if cluster is not None and ns.action in ("start", "stop", "status"):
            return _cluster_action(cluster, ns.action, settings, topics=not ns.no_topics)
        broker = _broker(settings, plaintext_port=ns.plaintext_port if ns.plaintext_listener else None)
        if ns.action == "fetch":
            libs = broker.fetch_jars()
            print(f"kafka jars ready in {libs}")
        elif ns.action == "start":
            t0 = time.monotonic()
            st = broker.start(topics=settings.topics)
            how = "started" if st.owned else "reused (already running)"
            print(f"kafka broker {how} at {st.bootstrap} (SASL_PLAINTEXT, ACLs on) in {time.monotonic() - t0:.1f}s"
                  + (f" (pid {st.pid})" if st.pid else "")
                  + (f"; not this home's: {whose(st)}" if st.foreign else ""))
            print(f"credentials of each principal in {broker.sasl_dir}; the operator's: "
                  + " ".join(f"{k}={v}" for k, v in broker.client_env(access.OPERATOR).items()))
            if st.plaintext_bootstrap:
                print(f"WARNING: INSECURE plain listener at {st.plaintext_bootstrap}: any client there may read "
                      "and write every topic without credentials", file=sys.stderr)
            if not ns.no_topics:
                created = ensure_topics(st.bootstrap, settings.topics, security=broker.security(access.ADMIN))
                print(f"topics: {len(created)} created, {len(settings.topics.specs())} in all")
        elif ns.action == "stop":
            print("kafka broker stopped" if broker.stop() else "no broker started by apprentice is running")
        elif ns.action == "acls":
            return _acls(broker, Topics(settings.topic_prefix if ns.prefix is None else ns.prefix),
                         apply=ns.apply, describe=ns.describe)
        elif ns.action == "rotate":
            if ns.principal is None:
                ap.error("rotate needs --principal")
            broker.rotate(ns.principal)
            print(f"new password for {ns.principal!r} in {broker.password_file(ns.principal)}"
                  + ("; restart the broker (`apprentice kafka stop`, `start`) for it to take effect"
                     if ns.principal == access.ADMIN else "; restart the processes that use it"))
        else:
            st = broker.status()
            if st.foreign:  # the data folder of the broker that answers, never this home's unused one
                print(f"kafka broker up at {st.bootstrap}, not this home's: {whose(st)} "
                      f"(this home's broker would keep its data in {st.data_dir})")
                return 0
            state = "up" if st.running else "down"
            owner = f", started by apprentice (pid {st.pid})" if st.owned else (", external" if st.running else "")
            print(f"kafka broker {state} at {st.bootstrap}{owner}; data {st.serving_data_dir or st.data_dir}")
            return 0 if st.running else 1
    except BrokerError as e:
        print(f"apprentice kafka {ns.action}: {e}", file=sys.stderr)
        return 1
    except PrefixClash as e:
        print(f"apprentice kafka {ns.action}: {e}", file=sys.stderr)
        return 2
    return 0


def _cluster(settings: CommonSettings, brokers: int | None) -> LocalCluster | None:
    """The cluster `--brokers N` (N > 1) asks for, or the one this home recorded when N is not given."""
    host, _, port = settings.kafka_bootstrap.split(",")[0].rpartition(":")
    if brokers is not None and brokers > 1:
        return LocalCluster(settings.home, brokers, host=host or "127.0.0.1", port=int(port or DEFAULT_PORT))
    recorded = LocalCluster.recorded(settings.home)
    if brokers == 1 and recorded is not None:
        raise BrokerError(f"this home records a cluster of {recorded.brokers} brokers ({recorded.layout_file}): stop "
                          f"it, then remove {recorded.home / 'cluster'} and that file to go back to one broker")
    return recorded


def _cluster_action(cluster: LocalCluster, action: str, settings: CommonSettings, *, topics: bool) -> int:
    if action == "stop":
        print(f"kafka cluster of {cluster.brokers} brokers stopped" if cluster.stop()
              else "no node started by apprentice is running")
        return 0
    if action == "status":
        st = cluster.status()
        for n, node in zip(st.nodes, cluster.nodes, strict=True):
            print(f"node {node.node_id} {'up' if n.running else 'down'} at {n.bootstrap}"
                  + (f" (pid {n.pid})" if n.pid else "") + f"; data {node.data}")
        print(f"kafka cluster: {st.running} of {cluster.brokers} brokers up; bootstrap {st.bootstrap}")
        return 0 if st.running == cluster.brokers else 1
    t0 = time.monotonic()
    st = cluster.start(topics=settings.topics)
    print(f"kafka cluster of {cluster.brokers} brokers up at {st.bootstrap} (SASL_PLAINTEXT, ACLs on, replication "
          f"factor {cluster.nodes[0].replication}, min.insync.replicas {cluster.nodes[0].min_insync}) in "
          f"{time.monotonic() - t0:.1f}s")
    print(f"credentials of each principal in {cluster.sasl_dir}; the operator's: "
          + " ".join(f"{k}={v}" for k, v in cluster.client_env(access.OPERATOR).items()))
    if topics:
        created = ensure_topics(st.bootstrap, settings.topics, security=cluster.security(access.ADMIN))
        print(f"topics: {len(created)} created, {len(settings.topics.specs())} in all")
    return 0


def _acls(broker: LocalBroker, topics: Topics, *, apply: bool, describe: bool) -> int:
    """`apprentice kafka acls`: the table; with --apply the users and ACLs of `topics`' deployment are
    created on the broker (as admin); with --describe the ACLs it holds for that deployment are printed."""
    if not (apply or describe):
        print("\n".join(table_lines()))
        print(f"\n{len(grants(topics))} ACL bindings for the prefix {topics.prefix!r} (--apply creates them)")
        return 0
    if apply:
        created = broker.ensure_access(topics)
        print(f"{len(created)} ACL bindings created for the prefix {topics.prefix!r} "
              f"({len(grants(topics))} wanted; SCRAM users of {', '.join(access.PRINCIPALS)} set)")
    if describe:
        for g in describe_acls(broker.admin_client(), topics):
            print(g)
    return 0


def share_broker(settings: CommonSettings, sasl_dir: Path) -> int:
    """Set up the deployment of `settings` (its topics, the ACLs of its prefix) on another home's local
    broker, as that broker's admin (its credentials in `sasl_dir`): `apprentice up --use-running-broker`."""
    su = principal_security(sasl_dir, access.ADMIN)
    try:
        created = apply_acls(admin(settings.kafka_bootstrap, security=su), grants(settings.topics))
        ensure_topics(settings.kafka_bootstrap, settings.topics, security=su)
    except (KafkaException, OSError, TimeoutError, PrefixClash) as e:
        print(f"apprentice up: cannot set up the shared broker at {settings.kafka_bootstrap} as the admin of "
              f"{sasl_dir}: {e}", file=sys.stderr)
        return 1
    st = LocalBroker.for_settings(settings).status()
    print(f"kafka broker shared at {settings.kafka_bootstrap} (not this home's: {whose(st)}): {len(created)} ACL "
          f"bindings created for the prefix {settings.topic_prefix!r}")
    return 0


def _unreachable(command: str, settings: CommonSettings) -> bool:
    """Probe the broker first (quietly): when it does not answer, say so in one line (tools/cli/failures.py)
    instead of the Kafka client's retry log followed by a traceback. (`tail` follows a topic like `tail -F`:
    it keeps waiting for a broker that is starting, with the client's one "unreachable" line.)"""

    if broker_answers(settings.kafka_bootstrap, timeout=5.0, security=settings):
        return False
    print(f"apprentice {command}: {unreachable(KAFKA, settings.kafka_bootstrap)}", file=sys.stderr)
    return True


def grant_local_deployment(settings: CommonSettings) -> int:
    """On the local broker whose credentials this process holds (`apprentice topics` as this home's
    `operator`), the ACLs of the deployment of `settings` (its topic prefix), created as that broker's admin, as
    `kafka start` and `kafka acls --apply` create them: a prefixed stack is set up by the documented commands
    alone. Returns how many bindings were created (0: all there, or not a local broker: an external cluster's
    ACLs are its admin's, docs/deployment.md)."""
    sasl_dir = local_credentials_dir(os.environ)
    if sasl_dir is None or settings.kafka_sasl_username == access.ADMIN:
        return 0
    wanted = grants(settings.topics)
    try:
        return len(apply_acls(admin(settings.kafka_bootstrap, security=principal_security(sasl_dir, access.ADMIN)),
                              wanted))
    except (KafkaException, TimeoutError) as e:   # not this home's broker after all: the refusal, if any, says it
        print(f"apprentice topics: the ACLs of the prefix {settings.topic_prefix!r} were not applied as the local "
              f"broker's admin ({e}); creating the topics as {settings.kafka_sasl_username!r}", file=sys.stderr)
        return 0


def topics(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice topics", description="Create missing topics and list them.")
    ap.add_argument("--no-create", action="store_true")
    ap.add_argument("--replication", type=int, default=None, metavar="N",
                    help="replication factor of the topics it creates (default: from the cluster's size, 3 with "
                         "min.insync.replicas 2 from three brokers on, else 1)")
    ns = ap.parse_args(argv)
    if ns.replication is not None and ns.replication < 1:
        ap.error("--replication must be at least 1")
    settings = CommonSettings()

    if _unreachable("topics", settings):
        return EXIT_UNREACHABLE
    if not ns.no_create:
        try:
            granted = grant_local_deployment(settings)
            if granted:
                print(f"{granted} ACL bindings created for the prefix {settings.topic_prefix!r} on the local broker")
            created = ensure_topics(settings.kafka_bootstrap, settings.topics, replication=ns.replication,
                                    security=settings)
        except (KafkaAccessDenied, PrefixClash) as e:   # one line naming the command that grants it
            print(f"apprentice topics: {e}", file=sys.stderr)
            return EXIT_STARTUP_ERROR
        except KafkaException as e:  # e.g. more replicas than brokers: the broker's own words
            print(f"apprentice topics: cannot create the topics: {e.args[0].str()}", file=sys.stderr)
            return 1
        for name in created:
            print(f"created {name}")
    ours = {s.name for s in settings.topics.specs()}
    for name, parts in list_topics(settings.kafka_bootstrap, security=settings).items():
        if name in ours:
            print(f"{name}\t{parts} partitions")
    return 0


def json_value(data: bytes | None) -> Any:
    """A JSON topic's record value as a document (None for a tombstone); UndecodableEvent when it is not
    JSON, so that `tail` prints the error line it prints for an undecodable event."""

    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError as e:
        raise UndecodableEvent(f"not a JSON document: {e}") from e


def signature_verdict(trust: RecordTrust, m: Any) -> dict[str, str]:
    """`{"signer": principal}` for a record a consumer would accept, `{"refused": reason}` otherwise,
    `{"checked": "off"}` when signatures are off (APPRENTICE_RECORD_SIGNATURES)."""
    if trust.verifier is None:
        return {"checked": "off"}
    v = trust.verdict(m.topic() or "", m.key(), m.value(), m.headers(), partition=m.partition(), offset=m.offset())
    return {"signer": v.principal} if v.ok else {"refused": v.reason}


def tail(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice tail", description="Print a topic's records as JSON lines.")
    ap.add_argument("topic", help="contract name (apprentice.graded.v1) or short name (graded)")
    ap.add_argument("--from-beginning", action="store_true")
    ap.add_argument("--max", type=int, default=0, help="stop after N records (0 = follow forever)")
    ap.add_argument("--timeout", type=float, default=0.0, help="stop after S seconds without records (0 = never)")
    ns = ap.parse_args(argv)
    settings = CommonSettings()

    try:
        topic = settings.topics.resolve(ns.topic)
    except KeyError as e:
        print(f"apprentice tail: {e.args[0]}", file=sys.stderr)
        return 2
    base = settings.topics.base_of(topic)
    msg_type = None if base not in EVENT_TOPICS else message_type(base)   # None: JSON values, printed as such
    group = private_group("apprentice-tail", settings.topic_prefix)     # named, for a refusal's line
    consumer = new_consumer(settings.kafka_bootstrap, purpose="apprentice-tail", group_id=group, security=settings,
                            offset_reset="earliest" if ns.from_beginning else "latest")
    consumer.subscribe([topic])
    # each record's signature verdict, as a consumer of the topic would judge it (shared/kafka/trust.py):
    # the operator sees who wrote it, or why a service refuses it
    trust = RecordTrust.from_settings(settings)
    seen, idle_since = 0, time.monotonic()
    try:
        while not ns.max or seen < ns.max:
            m = consumer.poll(0.5)
            if m is not None and m.error() and (refusal := denied(m.error(), name=topic, operation="READ",
                                                                   group=group, security=settings)) is not None:
                print(f"apprentice tail: {refusal}", file=sys.stderr)
                return EXIT_STARTUP_ERROR
            if m is None or m.error():
                if ns.timeout and time.monotonic() - idle_since > ns.timeout:
                    break
                continue
            idle_since = time.monotonic()
            meta: dict[str, Any] = {"topic": m.topic(), "partition": m.partition(), "offset": m.offset(),
                                    "key": (m.key() or b"").decode(errors="replace"),
                                    "signature": signature_verdict(trust, m)}
            try:
                value = json_value(m.value()) if msg_type is None else to_dict(decode(msg_type, m.value()))
                record = {**meta, "value": value}
            except UndecodableEvent as e:
                record = {**meta, "error": str(e)}
            print(json.dumps(record, ensure_ascii=False), flush=True)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0
