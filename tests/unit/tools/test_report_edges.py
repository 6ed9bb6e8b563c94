"""The report and the plot on every outcome a task can produce: 0% and 100% success, a single fact, no
OOD set, unicode. The plot is drawn for real (matplotlib, Agg) and the JSON read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.demo.cli import summary_line
from tools.demo.evaluation import EvalResult
from tools.demo.report import error_bars, plot, summarize, write_report
from tools.demo.stats import newcombe_diff, wilson


def _round(k: int, ok: int, total: int, ood_ok: int = 0, ood_total: int = 0, version: str = "base") -> dict[str, Any]:
    ev = EvalResult(policy_version=version, greedy_success=ok, greedy_total=total, sampled_success=0,
                    sampled_total=0, ood_success=ood_ok, ood_total=ood_total, mean_response_tokens=12.0,
                    examples=[{"question": "Wo kann ich mein Velo abholen?", "answer": "An der Bärengasse ✓"}])
    return {"round": k, "eval": ev.as_dict(), "knowledge_items": ["Der «Service Basis» kostet CHF 89 — 🚲"]}


@pytest.mark.parametrize("n", [1, 3, 20, 100, 101])
def test_wilson_bounds_contain_the_rate_at_the_extremes(n: int) -> None:
    assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0
    for s in (0, 1, n - 1, n):
        if 0 <= s <= n:
            lo, hi = wilson(s, n)
            assert 0.0 <= lo <= s / n <= hi <= 1.0


def test_newcombe_refuses_an_empty_sample() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        newcombe_diff(0, 0, 1, 10)


@pytest.mark.parametrize(("outcomes", "improved"), [
    ([(0, 100), (0, 100)], False),     # 0% every round: the lower bar used to be -1e-17 (ValueError in matplotlib)
    ([(100, 100), (100, 100)], False), # 100% every round
    ([(0, 100), (100, 100)], True),    # from nothing to everything
    ([(0, 1), (1, 1)], False),         # a single fact, one held-out question: 0/1 -> 1/1 proves nothing
    ([(0, 3)], None),                  # round 0 only: no summary
], ids=["zero", "full", "zero-to-full", "single-fact", "one-round"])
@pytest.mark.parametrize("ood_total", [0, 10], ids=["no-ood", "ood"])
def test_report_and_plot_on_edge_outcomes(tmp_path: Path, outcomes: list[tuple[int, int]], improved: bool | None,
                                          ood_total: int) -> None:
    rounds = [_round(k, ok, n, ood_ok=ood_total, ood_total=ood_total, version="base" if k == 0 else f"v{k}")
              for k, (ok, n) in enumerate(outcomes)]
    below, above = error_bars(rounds)
    assert min(below + above) >= 0.0
    report_path = tmp_path / "rapport-zürich" / "report.json"
    report = write_report(report_path, {"task": "velo_atelier", "kpi": "booking_confirmed"}, rounds)
    back = json.loads(report_path.read_text(encoding="utf-8"))
    assert back["rounds"][0]["knowledge_items"] == ["Der «Service Basis» kostet CHF 89 — 🚲"]
    assert "Bärengasse ✓" in report_path.read_text(encoding="utf-8")  # written as UTF-8, not \\u escapes
    png = tmp_path / "learning_curve.png"
    plot(png, rounds, "velo_atelier · Velo-Atelier Löwenzahn · Zürich · oel")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    s = report["summary"]
    if len(rounds) < 2:
        assert s == {}
        return
    assert s["improved"] is improved
    if ood_total:
        assert s["ood_diff"] == 0.0 and s["ood_regressed"] is False
        assert "OOD change +0.0%" in summary_line(s)
    else:
        assert s["ood_diff"] is None and s["ood_diff_ci95"] is None and s["ood_regressed"] is False
        assert rounds[0]["eval"]["ood_rate"] is None
        assert summary_line(s).endswith("no OOD set")


@pytest.mark.parametrize(("share", "collapsed"), [(0.8, True), (0.5, True), (0.3, False)])
def test_a_significant_gain_from_one_reply_to_everything_is_a_collapse(share: float, collapsed: bool) -> None:
    """Run F's shape: 7% -> 24%, significant, but one reply answers most held-out questions and all of the
    gain is one fact's: collapsed, not improved."""
    first, last = _round(0, 16, 220), _round(4, 52, 220, version="v4")
    first["eval"].update(per_fact={"billing": [7, 44], "shipping": [3, 44]}, top_reply_share=0.1)
    last["eval"].update(per_fact={"billing": [33, 44], "shipping": [0, 44]}, top_reply_share=share,
                        top_reply="billing, shipping, returns, repairs or accounts.")
    s = summarize([first, last])
    assert s["heldout_diff_ci95"][0] > 0 and s["collapsed"] is collapsed and s["improved"] is not collapsed
    assert s["per_fact_diff"] == {"billing": round(26 / 44, 4), "shipping": round(-3 / 44, 4)}
    assert ("COLLAPSED: one reply to" in summary_line(s)) is collapsed


def test_a_single_fact_task_cannot_collapse() -> None:
    """Every held-out question of one fact has the same right answer: one reply to all of them is success."""
    first, last = _round(0, 0, 100), _round(1, 90, 100, version="v1")
    first["eval"].update(per_fact={"only": [0, 100]}, top_reply_share=1.0)
    last["eval"].update(per_fact={"only": [90, 100]}, top_reply_share=1.0)
    assert summarize([first, last])["improved"] is True


def test_most_common_reply_ignores_case_and_spacing() -> None:
    from tools.demo.evaluation import most_common_reply

    assert most_common_reply([]) == ("", 0.0)
    assert most_common_reply(["Billing,  Shipping", "billing, shipping", "Returns"]) == ("billing, shipping", 2 / 3)


def test_summary_difference_at_the_extremes() -> None:
    s = summarize([_round(0, 0, 100), _round(1, 100, 100)])
    assert s["heldout_diff"] == 1.0 and 0.9 < s["heldout_diff_ci95"][0] < 1.0 and s["heldout_diff_ci95"][1] == 1.0
    s = summarize([_round(0, 100, 100, 10, 10), _round(1, 0, 100, 0, 10)])
    assert s["heldout_diff"] == -1.0 and s["ood_regressed"] is True and not s["improved"]


def test_served_and_weights_only_and_correction_latency() -> None:
    r0, r1 = _round(0, 1, 100), _round(1, 45, 100)
    r0["eval_weights_only"], r1["eval_weights_only"] = _round(0, 1, 100)["eval"], _round(1, 20, 100)["eval"]
    r1["correction_latency_s"] = [12.0, 30.0, 8.0, 95.0]
    s = summarize([r0, r1])
    assert s["round1_diff"] == pytest.approx(0.44) and s["weights_only_diff"] == pytest.approx(0.19)
    assert s["weights_only_improved"] is True and s["correction_latency_s"] == {"p50": 12.0, "p95": 95.0, "n": 4,
                                                                              "max": 95.0}
    line = summary_line(s)
    assert "weights only +19.0%" in line and "p50 12 s, p95 95 s (n=4)" in line


def test_correction_latency_counts_only_other_questions_after_approval() -> None:
    from types import SimpleNamespace as X

    from shared.proto.apprentice.v1 import events_pb2
    from tools.demo.demo import correction_latencies, item_states

    approved = {"it": (100.0, "form", ("Which form?",)), "never": (100.0, "phone", ())}
    exchanges = [X(fact_id="form", question="Which form?", asked_at=101.0, answered_at=102.0, routed=True),   # same q
                 X(fact_id="form", question="Form code?", asked_at=99.0, answered_at=103.0, routed=True),    # before
                 X(fact_id="form", question="Form code?", asked_at=104.0, answered_at=106.0, routed=False),  # wrong
                 X(fact_id="form", question="Form code?", asked_at=107.0, answered_at=110.5, routed=True),
                 X(fact_id="phone", question="Extension?", asked_at=101.0, answered_at=102.0, routed=False)]
    assert correction_latencies(approved, exchanges) == {"it": 10.5}
    kb = events_pb2.KnowledgeSnapshot(items=[events_pb2.KnowledgeItem(status=s) for s in (
        events_pb2.ITEM_STATUS_PROPOSED, events_pb2.ITEM_STATUS_APPROVED, events_pb2.ITEM_STATUS_PINNED,
        events_pb2.ITEM_STATUS_CONSOLIDATED, events_pb2.ITEM_STATUS_RETIRED)])
    assert item_states(kb) == {"pending": 1, "serving": 2, "consolidated": 1, "retired": 1, "rejected": 0}
    assert item_states(None)["serving"] == 0


def test_trainer_overrides_become_the_trainers_variables() -> None:
    from tools.demo.cli import trainer_overrides

    assert trainer_overrides(["lr=2e-4", "finetune.kind=lora", " finetune.rank = 64"]) == {
        "APPRENTICE_TRAINER_LR": "2e-4", "APPRENTICE_TRAINER_FINETUNE__KIND": "lora",
        "APPRENTICE_TRAINER_FINETUNE__RANK": "64"}
    with pytest.raises(ValueError, match="no trainer setting 'learning_rate'"):
        trainer_overrides(["learning_rate=1"])
    with pytest.raises(ValueError, match="SETTING=VALUE"):
        trainer_overrides(["lr"])
    with pytest.raises(ValueError, match="lr='fast'"):
        trainer_overrides(["lr=fast"])
    with pytest.raises(ValueError, match="warmup_steps='-1'"):
        trainer_overrides(["warmup_steps=-1"])


@pytest.mark.parametrize("value", ["0", "5000"])
def test_a_reply_cap_out_of_range_is_refused_before_anything_starts(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.demo.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--algo", "grpo", "--max-new-tokens", value])
    assert e.value.code == 2 and "--max-new-tokens must be between 1 and 4096" in capsys.readouterr().err


def test_summary_reports_the_detectable_effect_and_the_paired_interval() -> None:
    def rnd(k: int, per_q: list[list[int]]) -> dict[str, object]:
        s = sum(x for x, _ in per_q)
        ev = EvalResult("base", 0, 0, s, sum(n for _, n in per_q), 0, 0, 3.0, per_question=per_q)
        return {"round": k, "eval": ev.as_dict()}

    s = summarize([rnd(0, [[1, 4]] * 55), rnd(1, [[2, 4]] * 55)])
    assert s["heldout_trials"] == [220, 220]
    assert s["heldout_mde"] == pytest.approx(0.1157, abs=1e-3)
    assert s["heldout_diff_ci95_by_message"] == [0.25, 0.25]
    assert "paired by message +25.0% to +25.0%" in summary_line(s)


def test_sweep_row_from_a_report() -> None:
    from tools.demo.sweep_table import row

    def rnd(k: int, hits: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
        ev = EvalResult("base", 0, 0, hits, 220, 0, 0, 3.0).as_dict()
        return {"round": k, "eval": ev, "seconds": 300.0, "train_steps": steps,
                "deploy": {"resolved": 40 + k, "answers": 240} if k else None}

    steps = [{"algorithm": "grpo", "kl_ref": kl, "seconds": 10.0} for kl in (0.0, 0.5, 0.1)]
    rounds = [rnd(0, 50, []), rnd(1, 70, steps)]
    report = {"rounds": rounds, "summary": summarize(rounds),
              "trainer_settings": {"finetune__kind": "lora", "finetune__rank": "64", "lr": "2e-4", "warmup_steps": "10"}}
    line = row("B", report)
    assert line.startswith("| B | LoRA r64 α32, lr 2e-4, KL β 0, warm-up 10 steps | 50 → 70/220 (23% → 32%) | +9% (")
    assert "| 41/240 | 3 | 0.50 (0.10) | 10.0 | 10.0 |" in line
    # a run stopped after its round-0 evaluation: a row of dashes, not a crash
    assert "| 50/220 (23%) | – | – | 0 | – |" in row("A", {"rounds": rounds[:1], "summary": {}})


def test_a_second_sigterm_cannot_interrupt_the_demos_shutdown() -> None:
    import signal

    from tools.demo.cli import terminate
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, terminate)
        with pytest.raises(SystemExit) as e:
            terminate(signal.SIGTERM, None)
        assert e.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
