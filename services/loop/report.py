"""Round results --> `report.json` and `learning_curve.png` (held-out success with 95% CIs, OOD check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.loop.stats import newcombe_diff


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Last round vs round 0: the difference of success rates with Newcombe's 95% interval."""
    if len(rounds) < 2:
        return {}
    first, last = rounds[0]["eval"], rounds[-1]["eval"]
    n1 = first["greedy_total"] + first["sampled_total"]
    n2 = last["greedy_total"] + last["sampled_total"]
    s1 = first["greedy_success"] + first["sampled_success"]
    s2 = last["greedy_success"] + last["sampled_success"]
    d, lo, hi = newcombe_diff(s1, n1, s2, n2)
    od, olo, ohi = newcombe_diff(first["ood_success"], first["ood_total"], last["ood_success"], last["ood_total"])
    return {"heldout_diff": d, "heldout_diff_ci95": [lo, hi], "improved": lo > 0,
            "ood_diff": od, "ood_diff_ci95": [olo, ohi], "ood_regressed": ohi < 0}


def write_report(path: Path, meta: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    report = {**meta, "rounds": rounds, "summary": summarize(rounds)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)
    return report


def plot(path: Path, rounds: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["round"] for r in rounds]
    rate = [r["eval"]["success_rate"] for r in rounds]
    lo = [r["eval"]["success_rate"] - r["eval"]["ci95"][0] for r in rounds]
    hi = [r["eval"]["ci95"][1] - r["eval"]["success_rate"] for r in rounds]
    ood = [r["eval"]["ood_rate"] for r in rounds]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.errorbar(xs, rate, yerr=[lo, hi], marker="o", capsize=4, label="held-out success (95% CI)")
    ax.plot(xs, ood, marker="s", linestyle="--", label="out-of-distribution check")
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
    ax.set_ylim(0, 1)
    ax.set_xticks(xs)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
