"""Grader throughput: graded records/s with rule graders vs a raw confluent-kafka passthrough, same run.

    .venv/bin/python load/grader_bench.py [--n 20000] [--batch 1000] [--workers 1,2] [--signatures required,off]

1. N realistic Interaction records (a chat prompt, a ~30-word answer, 120 response token ids with both
   log-prob arrays: ~1.4 kB each), built once and written to a fresh namespace per pipeline.
2. Baseline: confluent-kafka consume -> produce of the same records into another topic (idempotent
   producer, acks=all, commit after each flushed batch of --batch records). Measured before and after
   the graders; the ratio uses the mean of the two, because the machine's load drifts during a run.
3. The grader as in production (`python -m services.grader`, one process per worker, faust), with each
   --workers count, with a task of three rule graders (regex, contains, exact): every interaction is
   routed through the join topic, graded and emitted at once, with its state written to the changelog
   and confirmed (services/grader/stream/grade.py: three acknowledged writes per batch).
   Each grader row runs once per --signatures mode: `required` (every input checked, every graded
   record signed, shared/kafka/trust.py) and `off`; the inputs are signed as inference either way, and
   the ratio of the two is what record signatures cost.
4. The faust framework alone, same run: a minimal faust agent forwarding each record (the ceiling the
   framework leaves the grader; --no-faust-passthrough skips it).
Rates come from the output records' broker timestamps (first to last record), which leaves process
start-up and consumer-group joins out of every row. Prints a table and, per grader row, two ratios
measured in the same run: against the raw passthrough (the broker and client's own cost; target >= 0.5x)
and against the faust passthrough (what the grader's own work costs on top of the framework).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.contracts.topic_access import ADMIN  # noqa: E402
from shared.contracts.topics import INTERACTIONS, Topics  # noqa: E402
from shared.contracts.validation import KafkaHeaders, type_headers_for_topic  # noqa: E402
from shared.kafka.admin import admin, delete_topics, ensure_topics, list_topics, wait_for_broker  # noqa: E402
from shared.kafka.consumers import new_consumer  # noqa: E402
from shared.kafka.security import faust_credentials, librdkafka_config  # noqa: E402
from shared.kafka.signing import load_signer  # noqa: E402
from shared.settings import CommonSettings, default_home  # noqa: E402
from tests.helpers.grader import GraderProcess, interaction  # noqa: E402
from tools.broker.local_broker import apply_client_env  # noqa: E402

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

ANSWERS = (
    "Thanks for asking. The standard warranty on the X{model} blender is {months} months from the date of "
    "purchase; keep your receipt and register the product online to claim it.",
    "Your X{model} is covered for {months} months. After that, repairs are charged at cost, and the guarantee "
    "on spare parts is six months from the repair date.",
    "I checked order {order}: it shipped yesterday and should arrive within three working days. You will get "
    "a tracking link by email as soon as the carrier scans it.",
    "I cannot help with that.",
    "Sorry, I could not find an answer to that question in our policies. A colleague will contact you by email "
    "within one working day to help you further.",
)


def answer(i: int) -> str:
    """Varied responses (every rule passes on some and fails on others; no two interactions alike)."""
    return ANSWERS[i % len(ANSWERS)].format(model=100 + i % 900, months=12 + i % 25, order=40_000 + i)


def build_inputs(n: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of n interactions (fresh ids, 997 sessions, ~1.4 kB each)."""
    out = []
    for i in range(n):
        it = interaction(tenant="bench", task="rules", text=answer(i), n_tokens=120, session_id=f"s{i % 997}",
                         policy_version="v1")
        out.append((it.session_id.encode(), it.SerializeToString()))
    return out


def produce_inputs(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    p = Producer({**librdkafka_config(), "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 20, "compression.type": "lz4"})
    # written as inference would: signed (shared/kafka/signing.py), so a grader that requires signatures
    # grades them; a grader with signatures off ignores the headers
    inference = load_signer(CommonSettings().record_keys_path(), "inference")
    for i, (key, value) in enumerate(records):
        headers: KafkaHeaders = [*inference.headers(INTERACTIONS, key, value, type_headers_for_topic(topic))]
        p.produce(topic, value, key, headers=headers)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)


def passthrough(bootstrap: str, src: str, dst: str, n: int, batch: int, timeout: float = 300.0) -> None:
    c = new_consumer(bootstrap, purpose="bench-pass")
    p = Producer({**librdkafka_config(), "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "compression.type": "lz4"})
    c.subscribe([src])
    done = 0
    deadline = time.monotonic() + timeout
    try:
        while done < n and time.monotonic() < deadline:
            msgs = [m for m in c.consume(batch, 0.5) if not m.error()]
            for m in msgs:
                p.produce(dst, m.value(), m.key())
                p.poll(0)
                c.store_offsets(m)      # the factory's consumers store nothing on their own
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
                    broker_credentials=faust_credentials(),
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


def output_rate(bootstrap: str, topic: str, n: int, timeout: float,
                probe: Any = None) -> tuple[int, float, float]:
    """(records seen, records/s between the first and the last broker timestamp, `probe()` at the last
    record minus `probe()` at the first: e.g. the CPU the pipeline spent while it produced them, start-up
    left out); read_committed."""
    c = new_consumer(bootstrap, purpose="bench-read")
    c.subscribe([topic])
    stamps: list[int] = []
    deadline = time.monotonic() + timeout
    idle_since = time.monotonic()
    first = last = 0.0
    try:
        while len(stamps) < n and time.monotonic() < deadline:
            msgs = [m for m in c.consume(1000, 0.5) if not m.error()]
            if msgs and not stamps and probe is not None:
                first = probe()
            stamps.extend(m.timestamp()[1] for m in msgs)
            if msgs:
                idle_since = time.monotonic()
                last = probe() if probe is not None else 0.0
            elif stamps and time.monotonic() - idle_since > 30:
                break
    finally:
        c.close()
    if len(stamps) < 2:
        return len(stamps), 0.0, 0.0
    span = (max(stamps) - min(stamps)) / 1000.0
    return len(stamps), (len(stamps) - 1) / span if span > 0 else float("inf"), last - first


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid() -> int | None:
    """The local Kafka broker's process (the JVM running kafka.Kafka), if it runs on this machine."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"kafka.Kafka" in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    return None


FAUST_PASSTHROUGH = "faust passthrough (framework only, 1 worker)"


class Row:
    """One pipeline's figures: output records, records/s, and CPU microseconds per record spent by the
    pipeline's own processes and by the broker while it ran (the machine is shared: CPU per record says
    what each pipeline costs, whatever share of the cores it got)."""

    def __init__(self, name: str, n: int, rate: float, cpu_s: float, broker_s: float) -> None:
        self.name, self.n, self.rate = name, n, rate
        self.cpu_us = cpu_s / max(n, 1) * 1e6
        self.broker_us = broker_s / max(n, 1) * 1e6


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.bootstrap = args.bootstrap
        self.run_id = uuid.uuid4().hex[:8]
        self.prefixes: list[str] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="grader-bench-"))
        self.cfg = self.workdir / "bench.yaml"
        self.cfg.write_text(CONFIG)
        self.records = build_inputs(args.n)
        self.broker = broker_pid()

    def measure(self, name: str, run: Any) -> Row:
        """Run one pipeline; `run()` returns (records, records/s, pipeline CPU seconds)."""
        b0 = proc_cpu(self.broker) if self.broker else 0.0
        n, rate, cpu = run()
        b1 = proc_cpu(self.broker) if self.broker else 0.0
        return Row(name, n, rate, cpu, b1 - b0)

    def namespace(self, name: str) -> Topics:
        """A fresh namespace holding the N input records."""
        topics = Topics(prefix=f"gbench-{self.run_id}-{name}.")
        self.prefixes.append(topics.prefix)
        ensure_topics(self.bootstrap, topics)
        produce_inputs(self.bootstrap, topics.interactions, self.records)
        return topics

    def extra_topic(self, topics: Topics, name: str) -> str:
        client = admin(self.bootstrap)  # keep a reference: the future dies with the handle
        for fut in client.create_topics([NewTopic(topics.prefix + name, 6, 1)]).values():
            fut.result(30)
        return topics.prefix + name

    def raw(self, label: str) -> tuple[int, float, float]:
        topics = self.namespace(f"raw{label}")
        dst = self.extra_topic(topics, "passthrough")
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        passthrough(self.bootstrap, topics.interactions, dst, self.args.n, self.args.batch, self.args.timeout)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        n, rate, _ = output_rate(self.bootstrap, dst, self.args.n, 60)
        return n, rate, cpu

    def faust_passthrough(self) -> tuple[int, float, float]:
        topics = self.namespace("fpass")
        dst = self.extra_topic(topics, "faust-passthrough")
        env = {**os.environ, "BENCH_SRC": topics.interactions, "BENCH_DST": dst, "BENCH_BOOTSTRAP": self.bootstrap,
               "BENCH_DATADIR": str(self.workdir / "fpass")}
        with open(self.workdir / "fpass.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, __file__, "--faust-passthrough-worker"], start_new_session=True,
                                    env=env, stdout=subprocess.DEVNULL, stderr=log)
            try:
                return output_rate(self.bootstrap, dst, self.args.n, self.args.timeout,
                                   probe=lambda: proc_cpu(proc.pid))
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)

    def grader(self, workers: int, signatures: str = "required") -> tuple[int, float, float]:
        topics = self.namespace(f"grader{workers}{signatures}")
        env = {"APPRENTICE_TOPIC_PREFIX": topics.prefix, "APPRENTICE_KAFKA_BOOTSTRAP": self.bootstrap,
               "APPRENTICE_GRADER_CONFIG_PATH": str(self.cfg), "APPRENTICE_GRADER_METRICS_PORT": "0",
               "APPRENTICE_GRADER_BATCH_MAX": str(self.args.batch), "APPRENTICE_RECORD_SIGNATURES": signatures,
               "APPRENTICE_HOME": str(self.workdir / topics.prefix), "APPRENTICE_LOG_JSON": "false",
               "APPRENTICE_GRADER_LOG_LEVEL": os.environ.get("APPRENTICE_GRADER_LOG_LEVEL", "WARNING")}
        procs = [GraderProcess(env, self.workdir / f"{topics.prefix}grader-{i}.log").start() for i in range(workers)]
        try:
            n, rate, cpu = output_rate(self.bootstrap, topics.graded, self.args.n, self.args.timeout,
                                       probe=lambda: sum(proc_cpu(p.proc.pid) for p in procs if p.proc is not None))
            if n < self.args.n:
                print(f"WARNING: grader x{workers}: only {n}/{self.args.n} graded records; log tail:\n"
                      f"{procs[0].log_tail()}", flush=True)
            return n, rate, cpu
        finally:
            for p in procs:
                p.stop()

    def cleanup(self) -> None:
        names = [t for t in list_topics(self.bootstrap) if t.startswith(tuple(self.prefixes))]
        delete_topics(self.bootstrap, names)
        shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    # against the local broker (SASL only, authorizing): this benchmark sets up its own topics, so it runs
    # as that broker's admin unless the environment sets Kafka credentials (docs/deployment.md)
    apply_client_env(default_home(), ADMIN)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1000, help="records per batch: passthrough and APPRENTICE_GRADER_BATCH_MAX")
    ap.add_argument("--workers", default="1,2", help="comma-separated grader worker counts, one row each")
    ap.add_argument("--no-faust-passthrough", action="store_true")
    ap.add_argument("--bootstrap", default=os.environ.get("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--signatures", default="required,off",
                    help="APPRENTICE_RECORD_SIGNATURES of the grader rows, comma-separated: one row each")
    ap.add_argument("--faust-passthrough-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.faust_passthrough_worker:
        faust_passthrough_worker()
        return 0
    wait_for_broker(args.bootstrap, 30)
    bench = Bench(args)
    rows: list[Row] = []
    try:
        rows.append(bench.measure("raw confluent-kafka passthrough (before)", lambda: bench.raw("a")))
        for w in [int(x) for x in args.workers.split(",") if x]:
            for mode in [m for m in args.signatures.split(",") if m]:
                rows.append(bench.measure(f"grader, {w} worker(s), 3 rule graders, sig {mode}",
                                          lambda w=w, mode=mode: bench.grader(w, mode)))
        if not args.no_faust_passthrough:
            rows.append(bench.measure(FAUST_PASSTHROUGH, bench.faust_passthrough))
        rows.append(bench.measure("raw confluent-kafka passthrough (after)", lambda: bench.raw("b")))
    finally:
        bench.cleanup()
    base = (rows[0].rate + rows[-1].rate) / 2
    print()
    print(f"{'pipeline':<48}{'records':>8}{'records/s':>11}{'vs raw':>8}{'cpu us/rec':>12}{'broker us/rec':>15}")
    for r in rows:
        print(f"{r.name:<48}{r.n:>8}{r.rate:>11.0f}{r.rate / base if base else 0:>7.2f}x{r.cpu_us:>12.0f}"
              f"{r.broker_us:>15.0f}")
    print(f"(vs raw = rate / mean of the two passthrough runs, {base:.0f} records/s; cpu = the pipeline's own "
          f"processes, broker = the broker's CPU while it ran; load average {os.getloadavg()[0]:.1f})")
    framework = next((r.rate for r in rows if r.name == FAUST_PASSTHROUGH), 0.0)
    by_name = {r.name: r.rate for r in rows}
    for r in rows:  # what record signatures cost: the same pipeline with APPRENTICE_RECORD_SIGNATURES=off
        off = by_name.get(r.name.replace("sig required", "sig off"))
        if "sig required" in r.name and off:
            print(f"ratio {r.name} / signatures off = {r.rate / off:.2f}x")
    ok = True
    for r in rows:
        if r.name.startswith("grader,"):
            ok = ok and r.n >= args.n
            print(f"ratio {r.name} / raw passthrough = {r.rate / base if base else 0:.2f}x (target >= 0.5x)")
            if framework:
                print(f"ratio {r.name} / faust passthrough = {r.rate / framework:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
