"""Grader throughput: graded records/s with rule graders vs a raw confluent-kafka passthrough, same run.

    .venv/bin/python load/grader_bench.py [--n 20000] [--workers 1] [--batch 1000]

1. A fresh topic namespace; N realistic Interaction records (a chat prompt, a ~30-word answer, 120
   response token ids with both log-prob arrays: ~1.4 kB each) on the interactions topic.
2. Baseline: confluent-kafka consume -> produce of the same records into another topic (idempotent
   producer, acks=all, commit after each flushed batch: the same delivery guarantees the grader gives).
3. The same framework without any grading: a minimal faust agent forwarding each record (faust's own
   ceiling on this machine, to separate framework cost from grader cost).
4. The grader, as in production (`python -m services.grader`, one process per --workers), with a task
   of three rule graders (regex, contains, exact) so every interaction is graded and emitted at once.
Both rates are taken from the output records' broker timestamps (first to last record), which leaves
process start-up and consumer-group joins out of both. Prints a table and the ratio (target >= 0.5x).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.grader.testing import GraderProcess, interaction  # noqa: E402
from shared.kafka.admin import admin, delete_topics, ensure_topics, list_topics, wait_for_broker  # noqa: E402
from shared.topics import Topics  # noqa: E402

CONFIG = """
version: bench-1
tasks:
  - tenant: bench
    task: rules
    graders:
      - {name: has_number, type: regex, pattern: "[0-9]+", weight: 1.0, success: true}
      - {name: mentions_warranty, type: contains, any_of: [warranty, guarantee], ignore_case: true, weight: 1.0}
      - {name: exact_refusal, type: exact, expected: "I cannot help with that.", weight: 0.5}
"""

ANSWER = ("Thanks for asking. The standard warranty on the X200 blender is 24 months from the date of "
          "purchase; keep your receipt and register the product online to claim it.")


def produce_inputs(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 20, "compression.type": "lz4"})
    for i in range(n):
        it = interaction(tenant="bench", task="rules", text=ANSWER, n_tokens=120, session_id=f"s{i % 997}",
                         policy_version="v1")
        p.produce(topic, it.SerializeToString(), it.session_id.encode())
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)


def passthrough(bootstrap: str, src: str, dst: str, n: int, timeout: float = 300.0) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-pass-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "compression.type": "lz4"})
    c.subscribe([src])
    done = 0
    deadline = time.monotonic() + timeout
    try:
        while done < n and time.monotonic() < deadline:
            msgs = [m for m in c.consume(1000, 0.5) if not m.error()]
            for m in msgs:
                p.produce(dst, m.value(), m.key())
                p.poll(0)
            if msgs:
                p.flush(30)
                c.commit(asynchronous=False)
                done += len(msgs)
    finally:
        c.close()


def faust_passthrough_worker() -> None:
    """A minimal faust app: records of BENCH_SRC -> BENCH_DST, batched like the grader's stages."""
    import asyncio

    import faust

    src_name, dst_name = os.environ["BENCH_SRC"], os.environ["BENCH_DST"]
    app = faust.App(f"{src_name}-faust-pass", broker=f"kafka://{os.environ['BENCH_BOOTSTRAP']}",
                    store="memory://", web_enabled=False, autodiscover=False, key_serializer="raw",
                    value_serializer="raw", consumer_auto_offset_reset="earliest",
                    consumer_max_fetch_size=4 * 1024 * 1024, stream_buffer_maxsize=4096,
                    datadir=os.environ["BENCH_DATADIR"], producer_acks=-1, producer_linger=0.005)
    src = app.topic(src_name, key_type=bytes, value_type=bytes)

    @app.agent(src)
    async def forward(stream):  # type: ignore[no-untyped-def]
        async for events in stream.take_events(1000, within=0.05):
            futs = [await app.producer.send(dst_name, ev.key, ev.value, None, None, None) for ev in events]
            await asyncio.gather(*futs)

    faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False).execute_from_commandline()


def output_rate(bootstrap: str, topic: str, n: int, timeout: float) -> tuple[int, float]:
    """(records seen, records/s between the first and the last broker timestamp)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-read-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    stamps: list[int] = []
    deadline = time.monotonic() + timeout
    idle_since = time.monotonic()
    try:
        while len(stamps) < n and time.monotonic() < deadline:
            msgs = [m for m in c.consume(1000, 0.5) if not m.error()]
            stamps.extend(m.timestamp()[1] for m in msgs)
            if msgs:
                idle_since = time.monotonic()
            elif stamps and time.monotonic() - idle_since > 30:
                break
    finally:
        c.close()
    if len(stamps) < 2:
        return len(stamps), 0.0
    span = (max(stamps) - min(stamps)) / 1000.0
    return len(stamps), (len(stamps) - 1) / span if span > 0 else float("inf")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=1, help="grader processes (each takes a share of partitions)")
    ap.add_argument("--batch", type=int, default=1000, help="APPRENTICE_GRADER_BATCH_MAX")
    ap.add_argument("--bootstrap", default=os.environ.get("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--faust-passthrough-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.faust_passthrough_worker:
        faust_passthrough_worker()
        return 0
    wait_for_broker(args.bootstrap, 30)

    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}.")
    ensure_topics(args.bootstrap, topics)
    pass_topic = topics.prefix + "passthrough"
    client = admin(args.bootstrap)  # keep a reference: the future dies with the handle
    fpass_topic = topics.prefix + "faust-passthrough"
    for fut in client.create_topics([NewTopic(pass_topic, 6, 1), NewTopic(fpass_topic, 6, 1)]).values():
        fut.result(30)
    workdir = Path(tempfile.mkdtemp(prefix="grader-bench-"))
    procs: list[GraderProcess] = []
    try:
        t0 = time.monotonic()
        produce_inputs(args.bootstrap, topics.interactions, args.n)
        print(f"produced {args.n} interactions in {time.monotonic() - t0:.1f}s", flush=True)

        passthrough(args.bootstrap, topics.interactions, pass_topic, args.n, args.timeout)
        n_pass, pass_rate = output_rate(args.bootstrap, pass_topic, args.n, 60)

        fpass = subprocess.Popen([sys.executable, __file__, "--faust-passthrough-worker"], start_new_session=True,
                                 env={**os.environ, "BENCH_SRC": topics.interactions, "BENCH_DST": fpass_topic,
                                      "BENCH_BOOTSTRAP": args.bootstrap, "BENCH_DATADIR": str(workdir / "fpass")},
                                 stdout=subprocess.DEVNULL, stderr=open(workdir / "fpass.log", "wb"))  # noqa: SIM115
        try:
            n_fpass, fpass_rate = output_rate(args.bootstrap, fpass_topic, args.n, args.timeout)
        finally:
            os.killpg(fpass.pid, signal.SIGTERM)
            fpass.wait(30)

        cfg = workdir / "bench.yaml"
        cfg.write_text(CONFIG)
        env = {"APPRENTICE_TOPIC_PREFIX": topics.prefix, "APPRENTICE_KAFKA_BOOTSTRAP": args.bootstrap,
               "APPRENTICE_GRADER_CONFIG_PATH": str(cfg), "APPRENTICE_GRADER_METRICS_PORT": "0",
               "APPRENTICE_GRADER_BATCH_MAX": str(args.batch), "APPRENTICE_HOME": str(workdir),
               "APPRENTICE_LOG_JSON": "false", "APPRENTICE_GRADER_LOG_LEVEL": "WARNING"}
        for i in range(args.workers):
            procs.append(GraderProcess(env, workdir / f"grader-{i}.log").start())
        n_graded, grader_rate = output_rate(args.bootstrap, topics.graded, args.n, args.timeout)
        if n_graded < args.n:
            print(f"WARNING: only {n_graded}/{args.n} graded records; log tail:\n{procs[0].log_tail()}")

        ratio = grader_rate / pass_rate if pass_rate else 0.0
        print()
        print(f"{'pipeline':<48}{'records':>9}{'records/s':>12}{'vs raw':>9}")
        rows = [("raw confluent-kafka passthrough", n_pass, pass_rate),
                ("faust passthrough (framework only, 1 worker)", n_fpass, fpass_rate),
                (f"grader, {args.workers} worker(s), 3 rule graders", n_graded, grader_rate)]
        for name, n, rate in rows:
            print(f"{name:<48}{n:>9}{rate:>12.0f}{rate / pass_rate if pass_rate else 0:>8.2f}x")
        print(f"\nratio grader / raw passthrough = {ratio:.2f}x (target >= 0.5x); "
              f"grader / faust passthrough = {grader_rate / fpass_rate if fpass_rate else 0:.2f}x")
        return 0 if n_graded >= args.n else 1
    finally:
        for p in procs:
            p.stop()
        names = [t for t in list_topics(args.bootstrap) if t.startswith(topics.prefix)]
        delete_topics(args.bootstrap, names)


if __name__ == "__main__":
    sys.exit(main())
