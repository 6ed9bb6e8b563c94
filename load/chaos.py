"""Chaos run: load through a private local stack while every service is kill -9'd in turn, the broker is
killed and restarted, and weights are swapped; then the topics must prove that nothing was lost or done
twice. Prints a table of figures; exits non-zero if any invariant fails.

    python load/chaos.py --run-dir /tmp/chaos            # tiny model, private broker, ~4 minutes
    python load/chaos.py --together                      # all five killed at once: ~2.5 minutes
    python load/chaos.py --kill inference,trainer --broker-fault stop --qps 8 --json figures.json
    # every stage replicated on a three-broker cluster (docs/cluster.md):
    python load/chaos.py --brokers 3 --replicas inference=2,grader=2,weights=2 --trainer-ranks 2 --together
        --kill inference,grader,extractor,trainer --promotion-kill

What it does, in order (load runs throughout: gRPC Generate + Feedback through the inference service from
several tenants with the task file's task tag, retrying failed calls as a product backend would):
1. a private broker on free ports under the run folder (the shared one at 9092 is never touched), the
   five services as supervised processes (`tools.stack.stack.LocalStack`), tiny model;
2. kill -9 of each service in `--kill` order; the supervisor restarts it; the next one goes once the
   previous answers again and the load ran `--dwell` seconds (`--together`: all at the same moment);
3. the broker: kill -9 (default; `--broker-fault stop` = SIGTERM, a clean shutdown), down `--broker-down`
   seconds, started again on the same port and data;
4. weight swaps under load: an operator version (a copy of the base weights) is uploaded and promoted
   for every tenant, then rolled back to base; and the trainer (RL on one tenant, small rounds)
   publishes versions that the weights service gates and auto-promotes for that tenant, waited for
   until `--min-trainer-versions` are promoted;
5. load stops, the pipeline drains, and the invariants are checked on the topics, the trainer's checkpoints
   and the clients' call records.

The run itself is `tests/helpers/chaos.py` (faults: `chaos_faults.py`, checks: `chaos_invariants.py`);
this is its command line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.chaos import KILL_ORDER, ChaosConfig, run_chaos  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=None, help="state, logs and broker data (default: a temp dir)")
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--task", default="support_desk")
    ap.add_argument("--tenants", default="acme,globex,initech")
    ap.add_argument("--trainer-tenant", default="acme")
    ap.add_argument("--kill", default=",".join(KILL_ORDER), help="services to kill -9, in this order ('' = none)")
    ap.add_argument("--together", action="store_true", help="kill the services at the same moment, not in turn")
    ap.add_argument("--broker-fault", choices=["kill", "stop", "none"], default="kill")
    ap.add_argument("--broker-down", type=float, default=4.0, help="seconds the broker stays down")
    ap.add_argument("--brokers", type=int, default=1,
                    help="3: a replicated cluster; its busiest leader is killed, then every node restarts in turn")
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--qps", type=float, default=4.0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--dwell", type=float, default=3.0, help="seconds of load between faults")
    ap.add_argument("--trigger-samples", type=int, default=8, help="trainer RL round size")
    ap.add_argument("--min-trainer-versions", type=int, default=1)
    ap.add_argument("--no-operator-swap", action="store_true")
    ap.add_argument("--replicas", default="", help="replicated services, e.g. inference=2,grader=2,weights=2 "
                                                   "(--kill inference-1 kills the second pod)")
    ap.add_argument("--trainer-ranks", type=int, default=1, help="the trainer as this many torchrun ranks")
    ap.add_argument("--promotion-kill", action="store_true",
                    help="kill -9 the weights replica gating the operator's promotion while the call waits")
    ap.add_argument("--strict-delivery", action="store_true", help="duplicate deliveries fail the run too")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the run folder (a temp one is removed otherwise)")
    ns = ap.parse_args(argv)
    run_dir = ns.run_dir or Path(tempfile.mkdtemp(prefix="apprentice-chaos-"))
    cfg = ChaosConfig(run_dir=run_dir, model=ns.model, task=ns.task, tenants=tuple(ns.tenants.split(",")),
                      trainer_tenant=ns.trainer_tenant, kill=tuple(k for k in ns.kill.split(",") if k), kill_together=ns.together,
                      broker_fault=ns.broker_fault, broker_down_s=ns.broker_down, concurrency=ns.concurrency,
                      qps=ns.qps, max_new_tokens=ns.max_new_tokens, dwell_s=ns.dwell,
                      trigger_samples=ns.trigger_samples, min_trainer_versions=ns.min_trainer_versions,
                      operator_swap=not ns.no_operator_swap, strict_delivery=ns.strict_delivery,
                      brokers=ns.brokers, trainer_ranks=ns.trainer_ranks, promotion_kill=ns.promotion_kill,
                      replicas={k: int(v) for k, v in (item.split("=", 1) for item in ns.replicas.split(",") if item)})
    try:
        result = run_chaos(cfg)
    finally:
        if ns.run_dir is None and not ns.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(result.table())
    print(f"\nseconds: {json.dumps({k: round(v, 1) for k, v in result.seconds.items()})}")
    print("ALL INVARIANTS HOLD" if result.ok else f"{len(result.failed)} INVARIANT(S) FAILED")
    if ns.json:
        ns.json.write_text(json.dumps({"ok": result.ok, "seconds": result.seconds,
                                       "figures": [asdict(f) for f in result.figures],
                                       "faults": [asdict(w) for w in result.faults]}, indent=1, default=str))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
