"""The shipped RL task (`support_routing`): its KPI rule on hand-made replies, as the simulated backend
applies it (`check_answer`), its splits, and the service configs it yields."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.demo.report import StepsLog, plot
from tools.tasks.config import write_task_config
from tools.tasks.task import check_answer, load_task

TASK = load_task("support_routing")
TEAMS = ("billing", "shipping", "returns", "repairs", "accounts")


@pytest.mark.parametrize(("team", "reply", "routed"), [
    ("billing", "Billing", True),
    ("billing", "billing.", True),
    ("billing", "This goes to the Billing team.", True),
    ("billing", "Billing. (Not Shipping.)", True),                 # the right team first: routed
    ("billing", "Shipping, or maybe Billing.", False),             # a wrong team first: misrouted
    ("billing", "Please contact our support team.", False),        # no team at all
    ("billing", "Billing, Shipping, Returns, Repairs or Accounts.", True),   # listing them all: the first wins
    ("shipping", "Billing, Shipping, Returns, Repairs or Accounts.", False),  # ... and it is wrong for the rest
    ("shipping", "Shipping", True),
    ("shipping", "The Returns team handles that.", False),
    ("returns", "Return", True),                                   # singular counts for the team named
    ("returns", "Repairs", False),
    ("repairs", "I'd send this to Repairs.", True),
    ("repairs", "Returns first, then Repairs", False),
    ("accounts", "Accounts", True),
    ("accounts", "account team\nbilling", True),
    ("accounts", "Billing\nAccounts", False),
    ("accounts", "rebilling accounts", True),                      # word boundaries: 'rebilling' is no team
])
def test_kpi_rule_on_hand_made_replies(team: str, reply: str, routed: bool) -> None:
    assert (check_answer(TASK.fact_by_id(team), reply).value >= 1) is routed


def test_every_team_has_a_rule_and_only_its_own_name_passes() -> None:
    assert [f.id for f in TASK.facts] == list(TEAMS)
    for f in TASK.facts:
        for other in TEAMS:
            assert (check_answer(f, other.capitalize()).value >= 1) is (other == f.id), (f.id, other)


def test_splits_are_disjoint_and_the_ood_set_is_general() -> None:
    train = {q for _, q in TASK.train_questions()}
    held = {q for _, q in TASK.held_out_questions()}
    # 11 held-out messages per team: 55 x (greedy + 3 samples) see an 11-point change at 80% power (tools/demo/stats.py)
    assert len(train) == 35 and len(held) == 55 and not train & held
    assert len(TASK.out_of_distribution) >= 5
    assert not {it.question for it in TASK.out_of_distribution} & (train | held)
    assert TASK.kpi.name == "routed" and TASK.task == "routing"


def test_the_task_gives_valid_service_configs(tmp_path: Path) -> None:
    env = write_task_config(TASK, tmp_path)   # validated with the grader's and the gate's own loaders
    assert env["trainer"]["APPRENTICE_TRAINER_TENANT"] == "demo"
    assert (tmp_path / "grader.yaml").read_text(encoding="utf-8").count("kpi: routed") == 1


def test_steps_log_waits_for_a_partly_written_line(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    log = StepsLog(path)
    assert log.new_steps() == []                                    # no file yet
    path.write_text('{"kind": "step", "algorithm": "grpo", "step": 1, "time": 0, "metrics": {"reward_mean": 0.25}}\n'
                    '{"kind": "round", "algorithm": "grpo", "step": 1, "time": 0, "metrics": {}}\n'
                    '{"kind": "step", "algor', encoding="utf-8")
    assert log.new_steps() == [{"algorithm": "grpo", "step": 1, "reward_mean": 0.25}]
    with path.open("a", encoding="utf-8") as f:
        f.write('ithm": "grpo", "step": 2, "time": 0, "metrics": {"reward_mean": 0.5}}\n')
    assert log.new_steps() == [{"algorithm": "grpo", "step": 2, "reward_mean": 0.5}]


def test_plot_draws_the_step_panel_when_rl_steps_are_present(tmp_path: Path) -> None:
    from tools.demo.evaluation import EvalResult

    def rnd(k: int, steps: list[dict[str, float | str | int]]) -> dict[str, object]:
        ev = EvalResult("base", k, 15, 0, 0, 0, 0, 3.0)
        return {"round": k, "eval": ev.as_dict(), "train_steps": steps}

    steps = [{"algorithm": "grpo", "step": i, "reward_mean": 0.3, "stale_fraction": 0.5, "is_weight_mean": 1.0,
              "is_capped_fraction": 0.0, "clip_fraction": 0.1} for i in (1, 2)]
    with_steps, without = tmp_path / "a.png", tmp_path / "b.png"
    plot(with_steps, [rnd(0, []), rnd(1, steps)], "t")
    plot(without, [rnd(0, []), rnd(1, [{"algorithm": "oel_sft", "step": 1, "loss": 1.0}])], "t")
    from PIL import Image

    assert Image.open(with_steps).size[1] > Image.open(without).size[1]   # the second panel


def test_a_task_caps_its_replies_and_a_variant_can_lift_the_cap(tmp_path: Path) -> None:
    """A task's `max_new_tokens` caps the demo's budget (deployment and evaluation); a variant's `null` lifts
    its base's cap; `--max-new-tokens` overrides either."""
    from tools.demo.demo import reply_tokens

    base = tmp_path / "router16.yaml"
    base.write_text((Path(__file__).resolve().parents[3] / "tools" / "tasks" / "support_routing.yaml")
                    .read_text(encoding="utf-8").replace("name: support_routing\n", "name: router16\nmax_new_tokens: 16\n"),
                    encoding="utf-8")
    (tmp_path / "lifted.yaml").write_text("extends: router16.yaml\nname: lifted\nmax_new_tokens: null\n", encoding="utf-8")
    assert load_task(base).max_new_tokens == 16 and load_task(tmp_path / "lifted.yaml").max_new_tokens is None
    assert load_task("support_routing").max_new_tokens == 16      # the router: a team name, first
    for variant in ("support_routing_lookup", "support_routing_lookup_strict", "support_routing_agent"):
        assert load_task(variant).max_new_tokens is None, variant    # a reply may ask for the order first
    assert reply_tokens(48, None, 16) == 16 and reply_tokens(24, None, 16) == 16    # full and --quick budgets
    assert reply_tokens(48, None, None) == 48 and reply_tokens(8, None, 16) == 8    # the budget within the cap
    assert reply_tokens(48, 32, 16) == 32                                            # the flag wins
