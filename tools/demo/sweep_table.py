"""Demo reports --> one markdown row each: the RL sweep's table in docs/demo.md and the README.

    .venv/bin/python -m tools.demo.sweep_table docs/demo-grpo/sweep/*/report.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def settings_text(ts: dict[str, str]) -> str:
    """The settings a sweep varies, from the report's `trainer_settings` (the trainer's own defaults where absent)."""
    kind = ts.get("finetune__kind", "lora")
    what = "full fine-tuning" if kind == "full" else f"LoRA r{ts.get('finetune__rank', '16')} α{ts.get('finetune__alpha', '32')}"
    out = f"{what}, lr {ts.get('lr', '5e-5')}, KL β {ts.get('kl_beta', '0')}"
    if ts.get("warmup_steps", "0") not in ("", "0"):
        out += f", warm-up {ts['warmup_steps']} steps"
    if ts.get("ppo_epochs", "1") != "1":
        out += f", {ts['ppo_epochs']} epochs"
    return out


def row(name: str, report: dict[str, Any]) -> str:
    rounds, s = report["rounds"], report.get("summary") or {}
    ev = [r["eval"] for r in rounds]
    held = " → ".join(f"{e['greedy_success'] + e['sampled_success']}" for e in ev) + f"/{ev[0]['greedy_total'] + ev[0]['sampled_total']}"
    pct = " → ".join(f"{e['success_rate']:.0%}" for e in ev)
    steps = [st for r in rounds for st in r.get("train_steps") or [] if st.get("algorithm") == "grpo"]
    kls = [st["kl_ref"] for st in steps if "kl_ref" in st]
    kl = f"{max(kls):.2f} ({statistics.median(kls):.2f})" if kls else "–"
    secs = sum(st["seconds"] for st in steps) / max(1, len(steps))
    deployed = [r["deploy"] for r in rounds if r.get("deploy")]   # none in a run stopped after round 0
    deploy = " → ".join(str(d["resolved"]) for d in deployed) + f"/{deployed[-1]['answers']}" if deployed else "–"
    diff = "–"
    if s:
        lo, hi = s["heldout_diff_ci95"]
        by = s.get("heldout_diff_ci95_by_message")
        paired = f"; {by[0]:+.0%} to {by[1]:+.0%}" if by else ""
        diff = f"{s['heldout_diff']:+.0%} ({lo:+.0%} to {hi:+.0%}{paired})"
    minutes = sum(r["seconds"] for r in rounds) / 60
    return (f"| {name} | {settings_text(report.get('trainer_settings') or {})} | {held} ({pct}) | {diff} | {deploy} | "
            f"{len(steps)} | {kl} | {secs:.1f} | {minutes:.1f} |")


def main(argv: list[str]) -> int:
    for path in argv:
        p = Path(path)
        print(row(p.parent.name, json.loads(p.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
