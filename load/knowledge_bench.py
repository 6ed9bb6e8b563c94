"""What knowledge in context costs at serving time: Generate latency with the tenant's knowledge added vs
the same requests opting out (`no_knowledge`), on one inference process, same engine, interleaved A/B so
machine noise hits both sides alike.

The knowledge base is the shipped support task's ten corrections as approved items (each with its training
questions, as the extractor records them), published on the knowledge topic the way the extractor does;
the requests are the task's held-out questions, so nearly every one retrieves its item. The cost is the
retrieval (one sentence embedding of the question) plus the longer prompt (the frame and up to three
items). Target: p50 with knowledge <= 1.15x p50 without. A model that reads the knowledge often answers in
fewer tokens, which hides that cost, so a second pair of sides asks for one new token only: retrieval and
prefill alone, the overhead with nothing to hide it.

    .venv/bin/python load/knowledge_bench.py                              # SmolLM2, the demo's model
    .venv/bin/python load/knowledge_bench.py --model tiny-random --rounds 40
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load.inference_bench import header, pct, row, spawn_server  # noqa: E402
from services.inference.client import InferenceClient  # noqa: E402
from shared.contracts.events import make_envelope  # noqa: E402
from shared.contracts.topic_access import ADMIN  # noqa: E402
from shared.contracts.topics import Topics  # noqa: E402
from shared.kafka.admin import delete_topics, ensure_topics  # noqa: E402
from shared.kafka.producer import EventProducer  # noqa: E402
from shared.kafka.trust import record_signer  # noqa: E402
from shared.proto.apprentice.v1 import events_pb2  # noqa: E402
from shared.settings import CommonSettings, default_home  # noqa: E402
from tests.helpers.kafka import collect  # noqa: E402
from tools.broker.local_broker import apply_client_env  # noqa: E402
from tools.tasks.task import load_task  # noqa: E402

TENANT = "bench"


def knowledge_snapshot(task_name: str) -> events_pb2.KnowledgeSnapshot:
    """The task's corrections as approved items of tenant `bench`, as the extractor would publish them."""
    task = load_task(task_name)
    snap = events_pb2.KnowledgeSnapshot(key=f"{TENANT}/{task.task}", domain=task.task, version=1,
                                        envelope=make_envelope(TENANT, source="extractor"))
    train: dict[str, list[str]] = {}
    for f, q in task.train_questions():
        train.setdefault(f.id, []).append(q)
    for f in task.facts:
        text = " ".join(f.correction.split())
        snap.items.add(item_id=f.id, text=text, status=events_pb2.ITEM_STATUS_APPROVED, revision=1,
                       questions=train.get(f.id, [])[:3], token_count=max(1, len(text) // 4))
    return snap


def main(argv: list[str] | None = None) -> int:
    # against the local broker (SASL only, authorizing): this benchmark sets up its own topics, so it runs
    # as that broker's admin unless the environment sets Kafka credentials (docs/deployment.md)
    apply_client_env(default_home(), ADMIN)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="support_desk")
    ap.add_argument("--bootstrap", default=os.environ.get("APPRENTICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--rounds", type=int, default=20, help="requests per side")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)

    task = load_task(args.task)
    questions = [task.messages(q) for _, q in task.held_out_questions()]
    tmp = Path(tempfile.mkdtemp(prefix="knowledge-bench-"))
    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:6]}.")
    ensure_topics(args.bootstrap, topics)
    # the snapshot stands in for the extractor's: signed as the extractor (the keys directory comes with
    # the broker's client environment), else the serving pods refuse it
    producer = EventProducer(args.bootstrap, client_id="knowledge-bench",
                             signer=record_signer(CommonSettings(), "extractor"))
    producer.produce(topics.knowledge, f"{TENANT}/{task.task}", knowledge_snapshot(args.task))
    producer.flush(30)
    proc, port = spawn_server(args.model, args.bootstrap, topics.prefix, tmp)
    try:
        with InferenceClient(f"127.0.0.1:{port}") as c:
            c.wait_ready(600)

            def timed(i: int, knowledge: bool, max_new: int) -> float:
                t0 = time.perf_counter()
                r = c.generate(questions[i % len(questions)], max_new_tokens=max_new, tenant=TENANT,
                               task=task.task, session_id=f"{'k' if knowledge else 'w'}{max_new}-{i}",
                               no_knowledge=not knowledge)
                assert r.choices[0].token_count > 0
                return time.perf_counter() - t0

            for i in range(3):                                # warm-up, both sides
                timed(i, True, args.max_new_tokens)
                timed(i, False, args.max_new_tokens)
            without, with_k, pre_without, pre_with = [], [], [], []
            for i in range(args.rounds):                      # interleaved A/B
                without.append(timed(i, False, args.max_new_tokens))
                with_k.append(timed(i, True, args.max_new_tokens))
                pre_without.append(timed(i, False, 1))
                pre_with.append(timed(i, True, 1))
        captured = collect(args.bootstrap, topics.interactions, events_pb2.Interaction,
                           count=4 * args.rounds + 6, timeout=30)
        served = [e for e in captured if e.session_id.startswith("k")]
        with_items = sum(bool(e.knowledge_items) for e in served)
        extra = [len(e.prompt_token_ids) for e in served if e.knowledge_items]
        base_len = [len(e.prompt_token_ids) for e in captured if e.session_id.startswith("w")]
    finally:
        proc.terminate()
        proc.wait(30)
        producer.close()
        delete_topics(args.bootstrap, [s.name for s in topics.specs()])
        shutil.rmtree(tmp, ignore_errors=True)

    p50_w, p50_k = statistics.median(without), statistics.median(with_k)
    ratio = p50_k / p50_w
    print(f"\nknowledge in context, {args.model}, {args.rounds} requests per side, {args.max_new_tokens} new tokens; "
          f"{with_items}/{len(served)} requests received items; prompt tokens "
          f"{statistics.mean(base_len):.0f} -> {statistics.mean(extra) if extra else 0:.0f}\n")
    header()
    row("Generate p50, knowledge", f"{p50_w * 1000:.0f} ms (no_knowledge)", f"{p50_k * 1000:.0f} ms", ratio,
        "<= 1.15x", ratio <= 1.15)
    row("Generate p95, knowledge", f"{pct(without, 0.95) * 1000:.0f} ms", f"{pct(with_k, 0.95) * 1000:.0f} ms",
        pct(with_k, 0.95) / pct(without, 0.95), "-", True)
    pre = statistics.median(pre_with) / statistics.median(pre_without)
    row("prefill, 1 new token p50", f"{statistics.median(pre_without) * 1000:.0f} ms",
        f"{statistics.median(pre_with) * 1000:.0f} ms", pre, "-", True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
