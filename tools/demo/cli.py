"""`apprentice demo`: the loop end to end with simulated users; prints and plots the learning curve."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from shared.models import ModelUnavailable, check_model_name
from shared.settings import CommonSettings
from tools.tasks.task import TaskError, load_task


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="apprentice demo", description=__doc__)
    ap.add_argument("--task", default="support_desk", help="a shipped task name or a task YAML file")
    ap.add_argument("--rounds", type=int, default=None, help="learning rounds (default 2: fits 30 minutes on 2 cores; 4 with --algo grpo; 1 with --quick)")
    ap.add_argument("--report", type=Path, default=Path("report.json"),
                    help="report path; the plot goes beside it as learning_curve.png")
    ap.add_argument("--quick", action="store_true", help="a small budget (CI)")
    ap.add_argument("--algo", choices=["oel", "grpo", "both"], default="oel")
    ap.add_argument("--model", default=None, help="default: APPRENTICE_MODEL (smollm2-135m-instruct)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--facts-per-round", type=int, default=0, metavar="N",
                    help="continual mode: round k's users ask only about the k-th group of N new facts, and the "
                         "report's forgetting matrix shows every earlier group, weights only, round by round "
                         "(e.g. --rounds 4 --facts-per-round 3); 0 (default): every fact from round 1")
    ap.add_argument("--plant-hack", action="store_true",
                    help="after round 1, plant a candidate fine-tuned on the task tool's loophole and check the "
                         "loop refuses it (a task with a `tool`, e.g. support_routing_lookup)")
    ap.add_argument("--users", type=int, default=None,
                    help="simulated users per round (default 60; 10 with --quick)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="the longest reply, for the users and the evaluation alike (default 48; 24 with --quick): "
                         "the product's cap on this task's answers")
    ap.add_argument("--trainer", action="append", default=[], metavar="SETTING=VALUE",
                    help="a trainer setting for this run, as in services/trainer/settings.py (e.g. lr=2e-4, "
                         "finetune.kind=lora, finetune.rank=16, kl_beta=0); repeatable; recorded in the report")
    ap.add_argument("--keep-runs", type=int, default=2,
                    help="run folders (checkpoints, logs: GiB each) kept under APPRENTICE_HOME/demo, this run "
                         "included; older ones are deleted at start")
    ns = ap.parse_args(argv)
    if ns.keep_runs < 1:
        ap.error("--keep-runs must be at least 1 (this run's folder)")
    if ns.users is not None and ns.users < 1:
        ap.error("--users must be at least 1")
    if ns.max_new_tokens is not None and not 1 <= ns.max_new_tokens <= 4096:
        ap.error("--max-new-tokens must be between 1 and 4096")
    try:
        trainer_env = trainer_overrides(ns.trainer)
    except ValueError as e:
        ap.error(str(e))

    signal.signal(signal.SIGTERM, terminate)
    try:
        # both checked before anything heavy is imported or started: a bad task file or model name is one
        # line, not a stack trace
        task = load_task(ns.task)
        if ns.plant_hack and task.tool is None:
            raise TaskError(f"--plant-hack needs a task with a tool (its loophole); {task.name!r} has none")
        check_model_name(ns.model or CommonSettings().model)
        # heavy: the demo loads the whole stack; `apprentice` imports this module
        from tools.demo.demo import run_demo

        report = run_demo(ns.task, rounds=ns.rounds, report=ns.report, quick=ns.quick, algo=ns.algo, model=ns.model,
                          seed=ns.seed, keep_runs=ns.keep_runs, plant_hack=ns.plant_hack,
                          users=ns.users, max_new_tokens=ns.max_new_tokens, trainer_env=trainer_env,
                          facts_per_round=ns.facts_per_round)
    except (TaskError, ModelUnavailable) as e:
        print(f"apprentice demo: {e}", file=sys.stderr)
        return 2
    s = report.get("summary") or {}
    print(f"\nreport: {ns.report}  plot: {ns.report.with_name('learning_curve.png')}")
    if s:
        print(summary_line(s))
    for row in report.get("forgetting") or []:       # the continual mode: weights only, per group of facts
        cells = ", ".join(f"facts of round {k.removeprefix('cohort_')} {v:.0%}" if v is not None else
                          f"facts of round {k.removeprefix('cohort_')} -" for k, v in row.items() if k != "round")
        print(f"round {row['round']} weights only: {cells or '(no facts asked yet)'}")
    if (hack := report.get("reward_hack")) is not None:
        print("reward-hack check: " + ", ".join(f"{k} {v}" for k, v in hack["verdict"].items()))
    return 0


def terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends the demo like Ctrl-C: the stack's services are stopped on the way out instead of being
    left running without their supervisor. Later SIGTERMs are ignored, because a second `kill` (or `pkill`
    followed by `kill`) arriving during that shutdown would abort it half-way and leave the services running:
    it happened to a sweep run, whose orphaned stack then took half the CPU from the next run."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signal.SIGTERM)


def summary_line(s: dict[str, Any]) -> str:
    """The run's verdict in one line; a task without an OOD set says so instead of an OOD change."""
    ood = f"OOD change {s['ood_diff']:+.1%}" if s.get("ood_diff") is not None else "no OOD set"
    line = (f"held-out success {s['heldout_diff']:+.1%} vs round 0 (95% CI {s['heldout_diff_ci95'][0]:+.1%} to "
            f"{s['heldout_diff_ci95'][1]:+.1%}")
    if (by_msg := s.get("heldout_diff_ci95_by_message")) is not None:
        line += f"; paired by message {by_msg[0]:+.1%} to {by_msg[1]:+.1%}"
    if s.get("heldout_mde") is not None:
        line += f"; sees a {s['heldout_mde']:.0%} effect at 80% power"
    line += f"); improved: {s['improved']}; {ood}"
    if s.get("collapsed"):
        line += f"; COLLAPSED: one reply to {s['top_reply_share']:.0%} of the held-out questions"
    if s.get("weights_only_diff") is not None:
        lo, hi = s["weights_only_diff_ci95"]
        line += f"; weights only {s['weights_only_diff']:+.1%} ({lo:+.1%} to {hi:+.1%})"
    if (lat := s.get("correction_latency_s")) is not None:
        line += f"; correction to a correct answer p50 {lat['p50']:.0f} s, p95 {lat['p95']:.0f} s (n={lat['n']})"
    return line


def trainer_overrides(pairs: list[str]) -> dict[str, str]:
    """`lr=2e-4`, `finetune.kind=lora` --> the trainer's environment variables (APPRENTICE_TRAINER_LR,
    APPRENTICE_TRAINER_FINETUNE__KIND). An unknown setting is refused here, before a stack starts, rather
    than ignored by the trainer half an hour later."""
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    from services.trainer.settings import TrainerSettings

    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise ValueError(f"--trainer takes SETTING=VALUE, got {pair!r}")
        top = name.split(".")[0]
        field = TrainerSettings.model_fields.get(top)
        if field is None:
            raise ValueError(f"--trainer: no trainer setting {top!r} (services/trainer/settings.py)")
        if "." not in name:   # a plain setting: its type and bounds checked now (a group's fields by the trainer)
            try:
                checked: Any = Annotated[field.annotation, field]    # the type with the field's bounds
                TypeAdapter(checked).validate_python(value)
            except ValidationError as e:
                raise ValueError(f"--trainer {name}={value!r}: {e.errors()[0]['msg']}") from None
        out["APPRENTICE_TRAINER_" + name.upper().replace(".", "__")] = value
    return out
