"""A task file --> the services' per-task config: the grader rewards the task's own KPI at once, the gate
scores the task's own held-out questions, the trainer trains the task's tenant."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.grader.core.detectors import DetectorStats
from services.grader.core.join import FEEDBACK, INTERACTION, Joiner
from services.grader.settings import DEFAULT_CONFIG
from services.weights.evalset import load_heldout, load_ood
from shared.grading import GraderConfig, load_grader_config
from tests.helpers.grader import feedback, interaction
from tools.tasks.config import general_ood_questions, write_task_config
from tools.tasks.task import TASKS_DIR, Task, TaskError, load_task

T0 = 1_800_000_000.0


def _grade_kpi(config: GraderConfig, task: Task, kpi_value: float) -> list[float]:
    """Rewards the grader's join state machine emits for one interaction of `task` and its KPI event,
    sent 5 s after the answer (well inside any window): empty when it is still waiting."""
    joiner = Joiner(config, DetectorStats(config.detectors), retention_s=3600, orphan_feedback_s=600)
    it = interaction(tenant=task.tenant, task=task.task, occurred_at=datetime.fromtimestamp(T0, UTC))
    out = []
    step = joiner.apply(None, it.interaction_id, INTERACTION + it.SerializeToString(), T0, partition=0)
    if step.emit is not None:
        out.append(step.emit.reward)
    fb = feedback(it.interaction_id, kpi_name=task.kpi.name, value=kpi_value, tenant=task.tenant)
    fb.envelope.occurred_at.FromMicroseconds(int((T0 + 5) * 1e6))
    step = joiner.apply(step.state, it.interaction_id, FEEDBACK + fb.SerializeToString(), T0 + 5, partition=0)
    if step.emit is not None:
        out.append(step.emit.reward)
    return out


def test_second_task_kpi_is_rewarded_at_once_with_the_generated_config(tmp_path: Path) -> None:
    task = load_task("velo_atelier")
    env = write_task_config(task, tmp_path)
    config = load_grader_config(env["grader"]["APPRENTICE_GRADER_CONFIG_PATH"])
    entry = config.for_task(task.tenant, task.task)
    assert entry is not None and (entry.tenant, entry.task) == (task.tenant, task.task)
    assert entry.feedback_window_s == task.kpi.feedback_window_s == 120
    assert _grade_kpi(config, task, 1.0) == [1.0]
    assert _grade_kpi(config, task, 0.0) == [0.0]
    # the packaged default knows only demo/support: this KPI would wait out the catch-all window unrewarded
    assert _grade_kpi(load_grader_config(DEFAULT_CONFIG), task, 1.0) == []
    # other tenants keep the default's routing (the catch-all and the shipped demo task)
    assert config.for_task("someone-else", "chat") == load_grader_config(DEFAULT_CONFIG).for_task("someone-else", "chat")
    assert config.version.startswith("task-velo_atelier-")


def test_shipped_task_config_matches_the_default_rewards(tmp_path: Path) -> None:
    task = load_task("support_desk")
    config = load_grader_config(write_task_config(task, tmp_path)["grader"]["APPRENTICE_GRADER_CONFIG_PATH"])
    default = load_grader_config(DEFAULT_CONFIG).for_task("demo", "support")
    assert default is not None
    assert config.for_task("demo", "support").graders == default.graders  # type: ignore[union-attr]
    assert _grade_kpi(config, task, 1.0) == [1.0]


def test_gate_eval_sets_come_from_the_task(tmp_path: Path) -> None:
    task = load_task("velo_atelier")
    env = write_task_config(task, tmp_path)
    held = load_heldout(Path(env["weights"]["APPRENTICE_WEIGHTS_EVAL_SET"]))
    assert [i.prompt for i in held.spec.items] == [q for _, q in task.held_out_questions()]
    assert held.spec.system == task.system_prompt and "Zürich" in (held.spec.system or "")
    assert [[g.name for g in gs] for gs in held.graders] == [[f.id] for f in task.facts]
    ood, _ = load_ood(Path(env["weights"]["APPRENTICE_WEIGHTS_OOD_SET"]))
    general = general_ood_questions()
    assert len(general) == 40
    # no OOD set of its own: the packaged general items only (reference answers + general questions)
    assert [i.prompt for i in ood.items if i.check is not None] == [q.question for q in general]
    assert sum(i.answer is not None for i in ood.items) == 8
    shipped = load_task("support_desk")
    ood2, _ = load_ood(Path(write_task_config(shipped, tmp_path / "s")["weights"]["APPRENTICE_WEIGHTS_OOD_SET"]))
    checked = [i.prompt for i in ood2.items if i.check is not None]
    assert len(shipped.out_of_distribution) == 10 and len(checked) == 40 + 10
    assert checked[40:] == [q.question for q in shipped.out_of_distribution]


def test_trainer_trains_the_task_tenant_without_an_oracle(tmp_path: Path) -> None:
    """The trainer gets the task's tenant and the held-out questions to leave out of its drills, and no
    answer check of the task file (an oracle no deployment has)."""
    task = load_task("velo_atelier")
    trainer = write_task_config(task, tmp_path)["trainer"]
    assert trainer["APPRENTICE_TRAINER_TENANT"] == "loewenzahn-velo"
    assert not any("VERIFIER" in k for k in trainer)
    excluded = Path(trainer["APPRENTICE_TRAINER_DISTILL_EXCLUDE_QUESTIONS"]).read_text(encoding="utf-8").splitlines()
    assert excluded == [q for _, q in task.held_out_questions()]
    assert not set(excluded) & {q for _, q in task.train_questions()}


def test_names_that_cannot_travel_are_refused(tmp_path: Path) -> None:
    src = TASKS_DIR / "velo_atelier.yaml"
    text = src.read_text(encoding="utf-8")
    for old, new, where in (("tenant: loewenzahn-velo", "tenant: löwenzahn/velo", "tenant"),
                            ("task: werkstatt", "task: werk statt", "task"),
                            ("name: booking_confirmed", "name: booking confirmed", "kpi.name")):
        bad = tmp_path / f"{where}.yaml"
        bad.write_text(text.replace(old, new, 1), encoding="utf-8")
        with pytest.raises(TaskError, match=where.replace(".", r"\.")):
            load_task(bad)


def test_up_task_puts_the_settings_in_the_stack_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`apprentice up --task`: the supervisor and the services inherit the task's settings; a variable the
    user set wins; a bad task stops `up` with the reason."""
    import os

    from tools.stack.cli import _apply_task

    env = {"APPRENTICE_TRAINER_TENANT": "set-by-user"}
    monkeypatch.setattr(os, "environ", env)
    assert _apply_task("velo_atelier", tmp_path) == "loewenzahn-velo"
    assert env["APPRENTICE_TRAINER_TENANT"] == "set-by-user"
    cfg = load_grader_config(env["APPRENTICE_GRADER_CONFIG_PATH"])
    assert cfg.for_task("loewenzahn-velo", "werkstatt") is not None
    assert Path(env["APPRENTICE_WEIGHTS_EVAL_SET"]).parent == tmp_path / "config"
    assert _apply_task(str(tmp_path / "missing.yaml"), tmp_path) is None
    assert "no task file" in capsys.readouterr().err


# --- business names: the task's own words reach every service that redacts ----------------------------
TRAILMATE_TASK = """\
name: trailmate
tenant: acme
task: support
system_prompt: "You are the support assistant of Brightwater Outfitters. Hannah Okafor leads the returns desk."
business_names: ["Trailmate", "Harbor Point"]
held_out_per_fact: 1
facts:
  - id: refunds
    fact: "Refunds over 200 dollars are approved by Dana Whitfield."
    answer_check: {type: contains, any_of: ["Dana Whitfield"]}
    correction: "Dana Whitfield approves refunds over 200 dollars; ask her via the Trailmate app."
    questions: ["Hi, I am Tom Becker. Who approves my refund?", "Who signs off large refunds?"]
"""


def test_declared_and_derived_business_names_reach_the_redacting_services(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from services.extractor.settings import ExtractorSettings
    from services.inference.settings import InferenceSettings
    from shared.privacy import Redactor

    src = tmp_path / "trailmate.yaml"
    src.write_text(TRAILMATE_TASK, encoding="utf-8")
    task = load_task(src)
    assert task.business_names == ["Trailmate", "Harbor Point"]
    env = write_task_config(task, tmp_path / "config", environ={"APPRENTICE_BUSINESS_NAMES": '{"globex": ["Hank"]}'})
    value = env["inference"]["APPRENTICE_BUSINESS_NAMES"]
    assert env["extractor"]["APPRENTICE_BUSINESS_NAMES"] == value
    # declared first, then what the detector finds in the business's own text; never the users' questions
    assert json.loads(value) == {"acme": ["Trailmate", "Harbor Point", "Hannah Okafor", "Dana Whitfield"],
                                 "globex": ["Hank"]}
    for key, v in env["inference"].items():
        monkeypatch.setenv(key, v)
    inference, extractor = InferenceSettings(pod_id="pod-1"), ExtractorSettings()
    assert extractor.common.business_names == inference.common.business_names == json.loads(value)
    # the simulated backend's correction keeps the business's words at the capture edge
    correction = task.facts[0].correction
    assert Redactor().scan(correction, tenant="t", business=inference.common.business_data_for("acme")).redacted == correction
    assert "<PERSON>" in Redactor().scan(correction, tenant="t", business=inference.common.business_data_for("globex")).redacted


def test_a_task_without_the_field_still_keeps_the_names_in_its_own_text(tmp_path: Path) -> None:
    src = tmp_path / "plain.yaml"
    src.write_text(TRAILMATE_TASK.replace('business_names: ["Trailmate", "Harbor Point"]\n', ""), encoding="utf-8")
    task = load_task(src)
    assert task.business_names == []
    env = write_task_config(task, tmp_path / "config", environ={})
    assert json.loads(env["extractor"]["APPRENTICE_BUSINESS_NAMES"]) == {"acme": ["Hannah Okafor", "Dana Whitfield"]}


@pytest.mark.parametrize(("names", "needle"), [('[""]', "may not be empty"), ('["*"]', "matched literally")])
def test_bad_business_names_in_a_task_file_are_refused(tmp_path: Path, names: str, needle: str) -> None:
    src = tmp_path / "bad.yaml"
    src.write_text(TRAILMATE_TASK.replace('["Trailmate", "Harbor Point"]', names), encoding="utf-8")
    with pytest.raises(TaskError, match="business_names") as e:
        load_task(src)
    assert needle in str(e.value)


def test_up_task_merges_business_names_with_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tools.stack.cli import _apply_task

    src = tmp_path / "trailmate.yaml"
    src.write_text(TRAILMATE_TASK, encoding="utf-8")
    env = {"APPRENTICE_BUSINESS_NAMES": '{"globex": ["Hank"], "acme": ["Brightwater Outfitters"]}'}
    monkeypatch.setattr(os, "environ", env)
    assert _apply_task(str(src), tmp_path) == "acme"
    assert json.loads(env["APPRENTICE_BUSINESS_NAMES"]) == {
        "acme": ["Brightwater Outfitters", "Trailmate", "Harbor Point", "Hannah Okafor", "Dana Whitfield"],
        "globex": ["Hank"]}


# --- business data: the task's phone numbers, e-mail, street and web addresses reach them too ---------
LOST_PROPERTY_TASK = """\
name: lost-property
tenant: acme
task: support
system_prompt: "You are the support assistant of Trailmate. Our web shop is https://www.trailmate.co.uk/shop."
business_data:
  phones: ["+44 131 496 0000"]
  addresses: ["12 Harbour Road, Leith, Edinburgh EH6 6LX"]
held_out_per_fact: 1
facts:
  - id: hotline
    fact: "Customer service is on 0800 414 2277."
    answer_check: {type: contains, any_of: ["0800 414 2277"]}
    correction: "Call customer service on 0800 414 2277"
    questions: ["hw do i call u? my number is 07700 900123", "whats ur phone number"]
  - id: lost
    fact: "Lost property is handled by e-mail."
    answer_check: {type: contains, any_of: ["found@trailmate.co.uk"]}
    correction: "Write to found@trailmate.co.uk about lost property"
    questions: ["lost my jacket, mail me at jane.roe@gmail.com", "where do i report lost stuff"]
"""


def test_declared_and_derived_business_data_reach_the_redacting_services(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's corrections on the second task ("Call customer service on 0800 414 2277", "Write to
    found@... about lost property") keep the business's number and mailbox at the capture edge; the users'
    own, written in the questions, are neither derived nor kept."""
    from services.extractor.settings import ExtractorSettings
    from services.inference.settings import InferenceSettings
    from shared.privacy import Redactor

    src = tmp_path / "lost.yaml"
    src.write_text(LOST_PROPERTY_TASK, encoding="utf-8")
    task = load_task(src)
    assert task.business_data.phones == ["+44 131 496 0000"]
    env = write_task_config(task, tmp_path / "config",
                            environ={"APPRENTICE_BUSINESS_DATA": '{"globex": {"phones": ["+1 415 555 0132"]}, '
                                                                 '"acme": {"emails": ["sales@trailmate.co.uk"]}}'})
    value = env["inference"]["APPRENTICE_BUSINESS_DATA"]
    assert env["extractor"]["APPRENTICE_BUSINESS_DATA"] == value
    # the environment's first, then declared, then what the detector finds in the business's own text
    assert json.loads(value) == {
        "acme": {"emails": ["sales@trailmate.co.uk", "found@trailmate.co.uk"],
                 "phones": ["+44 131 496 0000", "0800 414 2277"],
                 "addresses": ["12 Harbour Road, Leith, Edinburgh EH6 6LX"],
                 "urls": ["https://www.trailmate.co.uk/shop"]},
        "globex": {"phones": ["+1 415 555 0132"]}}
    for key, v in env["inference"].items():
        monkeypatch.setenv(key, v)
    inference, extractor = InferenceSettings(pod_id="pod-1"), ExtractorSettings()
    assert extractor.common.business_data == inference.common.business_data
    for fact in task.facts:
        assert Redactor().scan(fact.correction, tenant="t",
                               business=inference.common.business_data_for("acme")).redacted == fact.correction
        assert "<" in Redactor().scan(fact.correction, tenant="t",
                                      business=inference.common.business_data_for("globex")).redacted
    question = task.facts[0].questions[0]
    assert Redactor().scan(question, tenant="t", business=inference.common.business_data_for("acme")).redacted == \
        "hw do i call u? my number is <PHONE_NUMBER>"


@pytest.mark.parametrize(("data", "needle"), [
    ('{phones: ["2277"]}', "has 4 digits"),
    ('{emails: ["*@trailmate.co.uk"]}', "not one address"),
    ('{phone: ["0800 414 2277"]}', "phone"),
])
def test_bad_business_data_in_a_task_file_is_refused(tmp_path: Path, data: str, needle: str) -> None:
    src = tmp_path / "bad.yaml"
    text = LOST_PROPERTY_TASK.replace('business_data:\n  phones: ["+44 131 496 0000"]\n  addresses: '
                                      '["12 Harbour Road, Leith, Edinburgh EH6 6LX"]\n', f"business_data: {data}\n")
    assert text != LOST_PROPERTY_TASK
    src.write_text(text, encoding="utf-8")
    with pytest.raises(TaskError, match="business_data") as e:
        load_task(src)
    assert needle in str(e.value)


def test_up_task_merges_business_data_with_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tools.stack.cli import _apply_task

    src = tmp_path / "lost.yaml"
    src.write_text(LOST_PROPERTY_TASK, encoding="utf-8")
    env = {"APPRENTICE_BUSINESS_DATA": '{"globex": {"phones": ["+1 415 555 0132"]}}'}
    monkeypatch.setattr(os, "environ", env)
    assert _apply_task(str(src), tmp_path) == "acme"
    got = json.loads(env["APPRENTICE_BUSINESS_DATA"])
    assert got["globex"] == {"phones": ["+1 415 555 0132"]}
    assert "0800 414 2277" in got["acme"]["phones"] and got["acme"]["emails"] == ["found@trailmate.co.uk"]
