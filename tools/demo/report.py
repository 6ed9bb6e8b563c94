"""Round results --> `report.json` and `learning_curve.png` (held-out success with 95% CIs, OOD check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.demo.stats import min_detectable_effect, newcombe_diff, paired_bootstrap_diff


class StepsLog:
    """The trainer's per-step JSON lines (`APPRENTICE_TRAINER_EXPERIMENT_LOG__KIND=jsonl`), followed by offset: each
    call returns the optimizer steps written since the previous one, so every round's report entry holds
    the steps that trained toward it. A partly written last line waits for the next call."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.skipped = 0
        self.rounds: list[dict[str, Any]] = []
        """The trainer's round summaries read so far and not yet taken (`take_rounds`): for a consolidation
        round, where its time went (questions, teacher answers kept of those sampled, sampling seconds)."""

    def new_steps(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        steps: list[dict[str, Any]] = []
        for line in data[:end].decode("utf-8", "replace").splitlines():
            try:  # a line torn by a trainer killed mid-write is skipped, not a crash of the demo
                r = json.loads(line)
                if isinstance(r, dict) and r.get("kind") in ("step", "round"):
                    row = {"algorithm": str(r["algorithm"]), "step": int(r["step"]), **dict(r["metrics"])}
                    (steps if r["kind"] == "step" else self.rounds).append(row)
            except (ValueError, KeyError, TypeError):
                self.skipped += 1
        return steps

    def take_rounds(self) -> list[dict[str, Any]]:
        """The round summaries read since the last call (call after `new_steps`)."""
        out, self.rounds = self.rounds, []
        return out


COLLAPSE_SHARE = 0.5
"""A last round whose one greedy reply answers this share of the held-out questions (several facts) has
collapsed: `improved` is then False, whatever the interval says."""


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Last round vs round 0: the difference of success rates with Newcombe's 95% interval, and whether the
    last policy collapsed to one reply. A task without an OOD set has no OOD difference (None, never flagged
    as a regression)."""
    if len(rounds) < 2:
        return {}
    first, last = rounds[0]["eval"], rounds[-1]["eval"]
    n1 = first["greedy_total"] + first["sampled_total"]
    n2 = last["greedy_total"] + last["sampled_total"]
    s1 = first["greedy_success"] + first["sampled_success"]
    s2 = last["greedy_success"] + last["sampled_success"]
    d, lo, hi = newcombe_diff(s1, n1, s2, n2)
    # one reply to most held-out questions (of several facts) is a collapse, not learning: a constant answer
    # that is right for one fact's share of the questions can beat a weak base (docs/demo.md, run F)
    share = last.get("top_reply_share")
    collapsed = share is not None and len(last.get("per_fact") or {}) > 1 and share >= COLLAPSE_SHARE
    summary: dict[str, Any] = {"heldout_diff": d, "heldout_diff_ci95": [lo, hi], "improved": lo > 0 and not collapsed,
                               "collapsed": collapsed, "top_reply_share": share,
                               # the size of effect this evaluation can see (80% power) at round 0's rate
                               "heldout_mde": min_detectable_effect(s1 / max(1, n1), min(n1, n2)),
                               "heldout_trials": [n1, n2],
                               "ood_diff": None, "ood_diff_ci95": None, "ood_regressed": False}
    q1, q2 = first.get("per_question") or [], last.get("per_question") or []
    if q1 and len(q1) == len(q2):   # the same messages in both rounds: the paired, message-level interval
        _, blo, bhi = paired_bootstrap_diff([(s, n) for s, n in q1], [(s, n) for s, n in q2])
        summary["heldout_diff_ci95_by_message"] = [blo, bhi]
    f1, f2 = first.get("per_fact") or {}, last.get("per_fact") or {}
    if f1 and set(f1) == set(f2):   # where the change came from
        summary["per_fact_diff"] = {k: round(f2[k][0] / max(1, f2[k][1]) - f1[k][0] / max(1, f1[k][1]), 4) for k in f1}
    w1, w2 = rounds[0].get("eval_weights_only"), rounds[-1].get("eval_weights_only")
    if w1 and w2:   # the weights alone (no knowledge in context): what consolidation put into them
        wd, wlo, whi = newcombe_diff(w1["greedy_success"] + w1["sampled_success"], w1["greedy_total"] + w1["sampled_total"],
                                     w2["greedy_success"] + w2["sampled_success"], w2["greedy_total"] + w2["sampled_total"])
        summary.update(weights_only_diff=wd, weights_only_diff_ci95=[wlo, whi], weights_only_improved=wlo > 0)
    if len(rounds) > 1:
        r1 = rounds[1]["eval"]
        summary["round1_diff"] = r1["success_rate"] - first["success_rate"]
    lat = [x for r in rounds for x in r.get("correction_latency_s") or []]
    if lat:
        summary["correction_latency_s"] = latency_summary(lat)
    if first["ood_total"] > 0 and last["ood_total"] > 0:
        od, olo, ohi = newcombe_diff(first["ood_success"], first["ood_total"], last["ood_success"],
                                     last["ood_total"])
        summary.update(ood_diff=od, ood_diff_ci95=[olo, ohi], ood_regressed=ohi < 0)
    return summary


def latency_summary(xs: list[float]) -> dict[str, float | int]:
    """p50 / p95 (nearest rank) and count of latencies in seconds."""
    v = sorted(xs)

    def rank(q: float) -> float:
        return round(v[min(len(v) - 1, max(0, int(-(-q * len(v) // 1)) - 1))], 1)

    return {"p50": rank(0.5), "p95": rank(0.95), "n": len(v), "max": round(v[-1], 1)}


def forgetting_matrix(rounds: list[dict[str, Any]], cohorts: dict[str, int]) -> list[dict[str, Any]]:
    """The continual mode's forgetting matrix: for each evaluated round r, the weights-only success (greedy +
    sampled held-out answers) on the facts of every cohort c <= r (the facts whose users first asked in
    round c; `cohorts`: fact id -> c), from each round's `eval_weights_only.per_fact`. A fact consolidated in
    round c and forgotten later shows as a falling column."""
    out = []
    for r in rounds:
        per_fact = (r.get("eval_weights_only") or r.get("eval") or {}).get("per_fact") or {}
        row: dict[str, Any] = {"round": r["round"]}
        for c in sorted(set(cohorts.values())):
            if c > r["round"]:
                continue
            hits = [per_fact[f] for f, fc in cohorts.items() if fc == c and f in per_fact]
            ok, n = sum(h[0] for h in hits), sum(h[1] for h in hits)
            row[f"cohort_{c}"] = round(ok / n, 3) if n else None
        out.append(row)
    return out


def write_report(path: Path, meta: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    report = {**meta, "rounds": rounds, "summary": summarize(rounds)}
    if meta.get("fact_cohorts"):
        report["forgetting"] = forgetting_matrix(rounds, meta["fact_cohorts"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return report


def error_bars(rounds: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(below, above) each round's rate to its 95% bounds, never negative: matplotlib refuses negative
    error bars, and a rate at 0% or 100% sits on its bound up to floating-point noise."""
    below = [max(0.0, r["eval"]["success_rate"] - r["eval"]["ci95"][0]) for r in rounds]
    above = [max(0.0, r["eval"]["ci95"][1] - r["eval"]["success_rate"]) for r in rounds]
    return below, above


STEP_CURVES = (("reward_mean", "reward mean"), ("stale_fraction", "samples from older versions"),
               ("is_weight_mean", "IS weight mean"), ("is_capped_fraction", "IS clipped fraction"),
               ("clip_fraction", "PPO clip fraction"))


def plot_steps(ax: Any, steps: list[dict[str, Any]]) -> None:
    """The RL optimizer steps of the run: reward and how off-policy each step was."""
    xs = [s["step"] for s in steps]
    for key, label in STEP_CURVES:
        ys = [s.get(key) for s in steps]
        if any(y is not None for y in ys):
            ax.plot([x for x, y in zip(xs, ys, strict=True) if y is not None], [y for y in ys if y is not None],
                    marker=".", label=label)
    ax.set_xlabel("optimizer step")
    ax.legend(loc="upper left", fontsize=7)


def hack_notes(hack: dict[str, Any] | None) -> list[str]:
    """The reward-hack check (report["reward_hack"]) as lines under the picture."""
    if not hack:
        return []
    v = hack["verdict"]
    planted = hack.get("planted_version")
    lines = [f"reward hack: {hack['tool_calls']} tool calls in traffic, {hack['tool_timeouts']} timed out, "
             f"{hack['timeouts_masked_by_grader']} masked by the grader; flags "
             + (", ".join(f"{k} {n}" for k, n in sorted(hack["flags"].items())) or "none"),
             f"flagged and trained on: {sum(len(x) for x in hack['flagged_and_trained'].values())} "
             f"(versions checked: {', '.join(hack['trained_versions']) or 'none'})"]
    if planted:
        lines.append(f"planted hacked candidate {planted}: {str(hack['planted_status']).removeprefix('VERSION_STATUS_')}"
                     f", {'never served' if v['planted_never_served'] else 'SERVED'}")
    return lines


def plot(path: Path, rounds: list[dict[str, Any]], title: str, notes: list[str] | None = None) -> None:
    # heavy: matplotlib, only to draw the learning curve
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    xs = [r["round"] for r in rounds]
    rate = [r["eval"]["success_rate"] for r in rounds]
    lo, hi = error_bars(rounds)
    rl_steps = [s for r in rounds for s in r.get("train_steps") or [] if not str(s.get("algorithm", "")).startswith("oel")]
    if rl_steps:   # a second panel with the per-step curve, only when the run took RL steps
        fig, (ax, ax_steps) = plt.subplots(2, 1, figsize=(7, 7), dpi=120)
        plot_steps(ax_steps, rl_steps)
    else:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.errorbar(xs, rate, yerr=[lo, hi], marker="o", capsize=4, label="held-out success as served (95% CI)")
    weights = [(r["round"], r["eval_weights_only"]["success_rate"]) for r in rounds if r.get("eval_weights_only")]
    if weights:   # the weights alone, no knowledge in context
        ax.plot([x for x, _ in weights], [y for _, y in weights], marker="D", color="tab:green",
                label="held-out success, weights only")
    ood = [(r["round"], r["eval"].get("ood_rate")) for r in rounds]
    ood_points = [(x, y) for x, y in ood if y is not None]
    if ood_points:  # a task without an OOD set draws no OOD line (not a line at 0)
        ax.plot([x for x, _ in ood_points], [y for _, y in ood_points], marker="s", linestyle="--",
                label="out-of-distribution check")
    loss = [r["gold_answer_loss"] for r in rounds if r.get("gold_answer_loss") is not None]
    if len(loss) == len(rounds):  # draw the loss curve only when every round measured it
        ax2 = ax.twinx()
        ax2.plot(xs, loss, color="grey", marker="^", linestyle=":", label="gold-answer loss (nats/token)")
        ax2.set_ylabel("gold-answer loss")
        ax2.legend(loc="center right", fontsize=8)
    for r in rounds:
        ax.annotate(r["eval"]["policy_version"], (r["round"], r["eval"]["success_rate"]), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=7)
    ax.set_xlabel("round")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.05)  # points and bars at 0% and 100% stay visible
    ax.set_xticks(xs)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    if notes:   # e.g. the reward-hack check, in the space made below the panels
        fig.subplots_adjust(bottom=0.06 + 0.03 * len(notes))
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7, family="monospace", va="bottom")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
