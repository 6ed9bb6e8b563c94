"""`apprentice kafka|topics|tail`: manage the local broker and look inside topics."""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from shared.config import CommonSettings


def _broker(settings: CommonSettings, *, sasl: bool = False, sasl_port: int = 9094):  # noqa: ANN202 - lazy imports
    from shared.kafka.local_broker import LocalBroker

    return LocalBroker.for_settings(settings, sasl=sasl, sasl_port=sasl_port)


def kafka(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice kafka", description="The local single-node KRaft broker.")
    ap.add_argument("action", choices=["start", "stop", "status", "fetch"])
    ap.add_argument("--no-topics", action="store_true", help="do not create the Apprentice topics on start")
    ap.add_argument("--sasl", action="store_true",
                    help="also serve a SASL_PLAINTEXT (SCRAM-SHA-512) listener on --sasl-port, with a generated "
                         "password kept under APPRENTICE_HOME (implied by APPRENTICE_KAFKA_SECURITY_PROTOCOL="
                         "SASL_PLAINTEXT, whose bootstrap address is then the SASL listener)")
    ap.add_argument("--sasl-port", type=int, default=9094, help="port of the SASL listener (default 9094)")
    ns = ap.parse_args(argv)
    settings = CommonSettings()
    from shared.kafka.local_broker import BrokerError
    from shared.kafka.security import PLAINTEXT

    try:
        broker = _broker(settings, sasl=ns.sasl, sasl_port=ns.sasl_port)
        if ns.action == "fetch":
            libs = broker.fetch_jars()
            print(f"kafka jars ready in {libs}")
        elif ns.action == "start":
            t0 = time.monotonic()
            st = broker.start()
            how = "started" if st.owned else "reused (already running)"
            print(f"kafka broker {how} at {st.bootstrap} in {time.monotonic() - t0:.1f}s"
                  + (f" (pid {st.pid})" if st.pid else ""))
            if st.sasl_bootstrap:
                print(f"SASL/SCRAM listener at {st.sasl_bootstrap}, user {broker.sasl_user!r}; clients use it with:")
                for name, value in broker.sasl_env().items():
                    print(f"  export {name}={value}")
            if not ns.no_topics:
                from shared.kafka.admin import ensure_topics

                created = ensure_topics(st.bootstrap, settings.topics, security=PLAINTEXT)  # the plain listener
                print(f"topics: {len(created)} created, {len(settings.topics.specs())} in all")
        elif ns.action == "stop":
            print("kafka broker stopped" if broker.stop() else "no broker started by apprentice is running")
        else:
            st = broker.status()
            state = "up" if st.running else "down"
            owner = f", started by apprentice (pid {st.pid})" if st.owned else (", external" if st.running else "")
            sasl = f"; SASL/SCRAM at {st.sasl_bootstrap}" if st.sasl_bootstrap else ""
            print(f"kafka broker {state} at {st.bootstrap}{owner}{sasl}; data {st.data_dir}")
            return 0 if st.running else 1
    except BrokerError as e:
        print(f"apprentice kafka {ns.action}: {e}", file=sys.stderr)
        return 1
    return 0


def topics(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice topics", description="Create missing topics and list them.")
    ap.add_argument("--no-create", action="store_true")
    ap.add_argument("--replication", type=int, default=1, metavar="N",
                    help="replication factor of the topics it creates (1 = single broker; 3 on a cluster)")
    ns = ap.parse_args(argv)
    if ns.replication < 1:
        ap.error("--replication must be at least 1")
    settings = CommonSettings()
    from shared.kafka.admin import ensure_topics, list_topics

    if not ns.no_create:
        from confluent_kafka import KafkaException

        try:
            created = ensure_topics(settings.kafka_bootstrap, settings.topics, replication=ns.replication,
                                    security=settings)
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


def tail(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice tail", description="Print a topic's records as JSON lines.")
    ap.add_argument("topic", help="contract name (apprentice.graded.v1) or short name (graded)")
    ap.add_argument("--from-beginning", action="store_true")
    ap.add_argument("--max", type=int, default=0, help="stop after N records (0 = follow forever)")
    ap.add_argument("--timeout", type=float, default=0.0, help="stop after S seconds without records (0 = never)")
    ns = ap.parse_args(argv)
    settings = CommonSettings()
    import json

    from confluent_kafka import Consumer

    from shared.events import UndecodableEvent, decode, message_type, to_dict
    from shared.kafka.client_logs import client_log_config
    from shared.kafka.security import librdkafka_config

    try:
        topic = settings.topics.resolve(ns.topic)
    except KeyError as e:
        print(f"apprentice tail: {e.args[0]}", file=sys.stderr)
        return 2
    msg_type = message_type(settings.topics.base_of(topic))
    consumer = Consumer({**librdkafka_config(settings), **client_log_config(settings.kafka_bootstrap),
                         "bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"apprentice-tail-{uuid.uuid4()}",
                         "enable.auto.commit": False,
                         "auto.offset.reset": "earliest" if ns.from_beginning else "latest"})
    consumer.subscribe([topic])
    seen, idle_since = 0, time.monotonic()
    try:
        while not ns.max or seen < ns.max:
            m = consumer.poll(0.5)
            if m is None or m.error():
                if ns.timeout and time.monotonic() - idle_since > ns.timeout:
                    break
                continue
            idle_since = time.monotonic()
            meta = {"topic": m.topic(), "partition": m.partition(), "offset": m.offset(),
                    "key": (m.key() or b"").decode(errors="replace")}
            try:
                record = {**meta, "value": to_dict(decode(msg_type, m.value()))}
            except UndecodableEvent as e:
                record = {**meta, "error": str(e)}
            print(json.dumps(record, ensure_ascii=False), flush=True)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0
