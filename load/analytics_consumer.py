"""Example analytics consumer: interactions + graded topics --> per-tenant, per-version reward tables.

What a data team would run beside the loop: it reads the topics as any Kafka consumer would (its own
group, binary protobuf values), keeps the highest revision of each graded record, and prints

    tenant  policy_version  interactions  graded  with_signal  mean_reward  success_rate  quarantined  mean_tokens

Usage: python load/analytics_consumer.py [--from-beginning] [--idle 5] [--json]

Against the local broker it logs in as the read-only `analytics` principal:
eval "$(apprentice env --kafka analytics)" first (SECURITY.md §5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from shared.contracts.events import UndecodableEvent, decode  # noqa: E402
from shared.kafka.consumers import new_consumer  # noqa: E402
from shared.proto.apprentice.v1 import events_pb2  # noqa: E402
from shared.settings import CommonSettings  # noqa: E402


@dataclass
class Row:
    interactions: int = 0
    tokens: int = 0
    graded: dict[str, events_pb2.GradedInteraction] = field(default_factory=dict)


def aggregate(interactions: list[events_pb2.Interaction],
              graded: list[events_pb2.GradedInteraction]) -> dict[tuple[str, str], dict[str, float]]:
    """Pure aggregation (tested offline): highest revision per interaction wins."""
    rows: dict[tuple[str, str], Row] = defaultdict(Row)
    for it in interactions:
        r = rows[(it.envelope.tenant, it.policy_version or "base")]
        r.interactions += 1
        r.tokens += len(it.response_token_ids)
    for g in graded:
        it = g.interaction
        r = rows[(g.envelope.tenant, it.policy_version or "base")]
        prev = r.graded.get(it.interaction_id)
        if prev is None or g.revision > prev.revision:
            r.graded[it.interaction_id] = g
    table = {}
    for key, r in sorted(rows.items()):
        sig = [g for g in r.graded.values() if g.has_signal]
        table[key] = {
            "interactions": r.interactions,
            "graded": len(r.graded),
            "with_signal": len(sig),
            "mean_reward": sum(g.reward for g in sig) / len(sig) if sig else float("nan"),
            "success_rate": sum(g.success for g in sig) / len(sig) if sig else float("nan"),
            "quarantined": sum(g.quarantined for g in r.graded.values()),
            "mean_tokens": r.tokens / r.interactions if r.interactions else float("nan"),
        }
    return table


def consume(settings: CommonSettings, from_beginning: bool, idle_s: float, max_s: float):  # noqa: ANN201
    topics = settings.topics
    # a group of the deployment's `analytics-` prefix: the one the broker lets the analytics principal use
    c = new_consumer(settings.kafka_bootstrap, purpose="analytics", security=settings,
                     group_id=topics.group_id(f"analytics-{uuid.uuid4().hex[:12]}"),
                     offset_reset="earliest" if from_beginning else "latest")
    c.subscribe([topics.interactions, topics.graded])
    interactions, graded, bad = [], [], 0
    last, start = time.monotonic(), time.monotonic()
    try:
        while time.monotonic() - last < idle_s and time.monotonic() - start < max_s:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            last = time.monotonic()
            try:
                if m.topic() == topics.interactions:
                    interactions.append(decode(events_pb2.Interaction, m.value()))
                else:
                    graded.append(decode(events_pb2.GradedInteraction, m.value()))
            except UndecodableEvent:
                bad += 1
    finally:
        c.close()
    return interactions, graded, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from-beginning", action="store_true")
    ap.add_argument("--idle", type=float, default=5.0, help="stop after this many seconds without records")
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    interactions, graded, bad = consume(CommonSettings(), ns.from_beginning, ns.idle, ns.max_seconds)
    table = aggregate(interactions, graded)
    if ns.json:
        print(json.dumps({f"{t}/{v}": row for (t, v), row in table.items()}, indent=1))
        return 0
    cols = ["interactions", "graded", "with_signal", "mean_reward", "success_rate", "quarantined", "mean_tokens"]
    print(f"{'tenant':<12} {'version':<10} " + " ".join(f"{c:>12}" for c in cols))
    for (tenant, version), row in table.items():
        print(f"{tenant:<12} {version:<10} " + " ".join(
            f"{row[c]:>12.3f}" if isinstance(row[c], float) else f"{row[c]:>12}" for c in cols))
    if bad:
        print(f"({bad} undecodable records skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
