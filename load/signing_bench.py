"""What signing costs on inference's produce path: a recorded Interaction serialised and enqueued on a
librdkafka producer (what EventProducer.produce does, shared/kafka/producer.py), unsigned vs signed with
the record's Ed25519 signature (shared/kafka/signing.py), interleaved in the same run so machine noise hits
both sides alike. No broker: the producer's queue only buffers (its bootstrap never answers), which is the
cost the request path pays, since delivery happens on librdkafka's own thread.

    .venv/bin/python load/signing_bench.py                  # 256-token prompt and response
    .venv/bin/python load/signing_bench.py --tokens 2048 --records 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from shared.contracts import topics as t  # noqa: E402
from shared.contracts.validation import type_headers  # noqa: E402
from shared.kafka.signing import RecordSigner  # noqa: E402
from shared.proto.apprentice.v1 import events_pb2  # noqa: E402


def _interaction(tokens: int) -> events_pb2.Interaction:
    text = "word " * tokens
    return events_pb2.Interaction(
        interaction_id=str(uuid.uuid4()), session_id="s", task="support", model="m", policy_version="v1",
        prompt_text=text, prompt_token_ids=list(range(tokens)), response_text=text,
        response_token_ids=list(range(tokens)), response_logprobs=[-0.5] * tokens,
        response_logprobs_t1=[-0.7] * tokens, finish_reason="stop")


def _run(producer: Producer, signer: RecordSigner | None, records: list[events_pb2.Interaction]) -> float:
    """Seconds per record to serialise, (sign) and enqueue."""
    start = time.perf_counter()
    for rec in records:
        payload = rec.SerializeToString()
        headers: list[tuple[str, str | bytes | None]] = [*type_headers(rec)]
        if signer is not None:
            headers = [*signer.headers(t.INTERACTIONS, rec.interaction_id, payload, headers)]
        producer.produce("bench-interactions", payload, rec.interaction_id, headers=headers)
        producer.poll(0)
    return (time.perf_counter() - start) / len(records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 10_000_000,
                         "queue.buffering.max.kbytes": 2_000_000, "log_level": 0})
    signer = RecordSigner("inference", Ed25519PrivateKey.generate())
    records = [_interaction(args.tokens) for _ in range(args.records)]
    size = len(records[0].SerializeToString())
    unsigned: list[float] = []
    signed: list[float] = []
    for _ in range(args.rounds):  # interleaved, the first round a warm-up for both sides
        unsigned.append(_run(producer, None, records))
        signed.append(_run(producer, signer, records))
        producer.purge()
    u, s = statistics.median(unsigned[1:]), statistics.median(signed[1:])
    print(f"record {size} bytes ({args.tokens} tokens each side), {args.records} records x {args.rounds - 1} rounds")
    print(f"unsigned {u * 1e6:.1f} us/record, signed {s * 1e6:.1f} us/record, "
          f"signing adds {(s - u) * 1e6:.1f} us, ratio signed/unsigned {s / u:.2f}")


if __name__ == "__main__":
    main()
