"""Per-item knowledge checks in the eval gate: the knowledge view (topic records --> items to ask), the
result of one item, and the rule that these results never block a candidate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from services.weights.gate import KNOWLEDGE, compare, integrity_result, knowledge_result, verdict
from services.weights.knowledge import KnowledgeView
from services.weights.orders import OrderDesk
from services.weights.settings import LocalStoreSettings, WeightsSettings
from services.weights.store import WeightStore
from shared.contracts.events import make_envelope
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from tests.helpers.weights_files import tensor_file

from .conftest import UploadFn
from .test_gate_drift import ScriptedEvaluator, scores
from .test_orders import Recorder

E = events_pb2


def item(item_id: str, *, status: int = E.ITEM_STATUS_APPROVED, questions: Sequence[str] = ("Q?",),
         terms: Sequence[str] = ("RF-7734",), revision: int = 1, updated: int = 100,
         text: str = "Returns need form RF-7734.") -> events_pb2.KnowledgeItem:
    return E.KnowledgeItem(item_id=item_id, text=text, status=status, questions=list(questions),  # type: ignore[arg-type]
                           answer_terms=list(terms), revision=revision, updated_at=Timestamp(seconds=updated))


def snapshot(key: str, version: int, items: list[events_pb2.KnowledgeItem],
             tenant: str | None = None) -> events_pb2.KnowledgeSnapshot:
    return E.KnowledgeSnapshot(envelope=make_envelope(tenant if tenant is not None else key.split("/")[0],
                                                      source="extractor"),
                               key=key, domain=key.split("/")[1], version=version, items=items)


# --- one item's result, and the verdict ----------------------------------------------------------------
def test_item_result_held_and_not_held() -> None:
    held = knowledge_result("item:acme/support:a@2", ["Use form RF-7734.", "It is RF7734"], ["RF-7734"], 0.5)
    assert (held.suite, held.candidate, held.baseline, held.threshold, held.passed, held.detail) == \
        (KNOWLEDGE, 1.0, 0.5, 1.0, True, "held")
    long = "I am not sure,\n" + "x" * 300
    lost = knowledge_result("item:acme/support:a@2", ["RF-7734", long, "no idea"], ["RF-7734"])
    assert not lost.passed and math.isclose(lost.candidate, 1 / 3) and math.isnan(lost.baseline)
    assert lost.detail == "not held: " + " ".join(long.split())[:120]          # the first failing answer
    assert not knowledge_result("m", [], ["x"]).passed


def test_knowledge_results_never_block() -> None:
    """An item the candidate does not hold is reported, not refused: the verdict leaves suite `knowledge`
    out of the decision and only counts it in the reason."""
    blocking = [integrity_result([], 3), compare("heldout", "rule_score", 0.6, 0.6, 0.1)]
    lost = [knowledge_result(f"item:acme/support:{i}@1", ["nothing"], ["RF-7734"]) for i in "abc"]
    passed, reason = verdict(blocking + lost)
    assert passed and not any(r.passed for r in lost)
    assert reason.startswith("passed the eval gate: integrity/nonfinite_tensors, heldout/rule_score")
    assert "knowledge (informational, never blocks): 0 of 3 items held" in reason and "item:" not in reason
    passed, reason = verdict([compare("heldout", "rule_score", 0.1, 0.6, 0.1), *lost])
    assert not passed and "item:" not in reason and reason.startswith("blocked: heldout/rule_score")


# --- the view of the knowledge topic -------------------------------------------------------------------
def test_view_keeps_the_highest_version_per_key_and_ignores_other_tenants_keys() -> None:
    view = KnowledgeView()
    assert view.apply(snapshot("acme/support", 2, [item("a")]))
    assert not view.apply(snapshot("acme/support", 1, [item("old")]))        # older: not current
    assert not view.apply(snapshot("acme/support", 2, [item("dup")]))        # redelivered
    assert not view.apply(snapshot("acme/billing", 1, [item("x")], tenant="mallory"))   # key of another tenant
    no_tenant = snapshot("acme/billing", 1, [item("x")])
    no_tenant.envelope.tenant = ""
    assert not view.apply(no_tenant)
    assert not view.apply(E.KnowledgeSnapshot(envelope=make_envelope("acme", source="x"), key="acme", version=1,
                                              items=[item("x")]))            # a key without a domain part
    assert view.ignored_other_tenant == 3
    assert [c.item_id for c in view.items_for("acme", 40)] == ["a"]
    assert view.items_for("mallory", 40) == [] and view.items_for("", 40) == []
    view.forget("acme/support")
    assert view.items_for("acme", 40) == []


def test_view_selects_checkable_items_newest_first_bounded() -> None:
    view = KnowledgeView()
    view.apply(snapshot("acme/support", 1, [
        item("approved", updated=10),
        item("pinned", status=E.ITEM_STATUS_PINNED, updated=30),
        item("consolidated", status=E.ITEM_STATUS_CONSOLIDATED, updated=20, revision=3),
        item("proposed", status=E.ITEM_STATUS_PROPOSED, updated=99),
        item("retired", status=E.ITEM_STATUS_RETIRED, updated=99),
        item("no-questions", questions=(), updated=99),
        item("no-terms", terms=(), updated=99),
    ]))
    view.apply(snapshot("acme/billing", 4, [item("billing", updated=25)]))
    view.apply(snapshot("other/support", 1, [item("foreign", updated=50)]))
    checks = view.items_for("acme", 40)
    assert [c.item_id for c in checks] == ["pinned", "billing", "consolidated", "approved"]
    assert checks[2].metric == "item:acme/support:consolidated@3"
    assert [c.item_id for c in view.items_for("acme", 2)] == ["pinned", "billing"]
    many = item("q", questions=["first?", "Second?", "second?", "third?", "  fourth \n?", "fifth?", "sixth?",
                                "seventh?", "eighth?", "ninth?", "tenth?", "eleventh?", "twelfth?"])
    view.apply(snapshot("acme/support", 2, [many]))
    (q,) = view.items_for("acme", 1)
    # the check questions (every third distinct one: third, sixth, ninth, twelfth; consolidation never trains
    # on them, shared/knowledge/check_questions.py), up to 3, newest (last) first
    assert q.questions == ("twelfth?", "ninth?", "sixth?")
    few = item("q", questions=["first?", "Second?", "second?"])          # two distinct: both are asked
    view.apply(snapshot("acme/support", 3, [few]))
    (q,) = view.items_for("acme", 1)
    assert q.questions == ("Second?", "first?")


def test_wait_ready_only_waits_when_followed() -> None:
    view = KnowledgeView()
    assert view.wait_ready(0)              # nobody follows the topic: nothing to wait for
    view.followed = True
    assert not view.wait_ready(0)
    view.mark_ready()
    assert view.wait_ready(0)


# --- the gate run --------------------------------------------------------------------------------------
class AnsweringEvaluator(ScriptedEvaluator):
    """The scripted gate whose model answers from a table (question -> answer per version)."""

    def __init__(self, store: WeightStore, settings: WeightsSettings, view: KnowledgeView,
                 answers: dict[str, dict[str, str]]) -> None:
        super().__init__(store, settings, {v: scores(0.02) for v in ("base", "v1", "v2")})
        self.knowledge = view
        self.answers = answers
        self.asked: list[list[dict[str, str]]] = []

    def answer(self, model: Any, m: weights_pb2.Manifest, chats: Sequence[list[dict[str, str]]]) -> list[str]:
        self.asked += list(chats)
        return [self.answers[m.version].get(c[-1]["content"], "I do not know.") for c in chats]


def test_gate_records_one_informational_result_per_item(store: WeightStore, upload: UploadFn) -> None:
    view = KnowledgeView()
    view.apply(snapshot("acme/support", 3, [
        item("form", questions=["Which form for returns?", "What do I fill in to return boots?"], updated=2),
        item("ext", questions=["Which extension reaches repairs?"], terms=["4410"], updated=1, revision=2,
             text="Repairs are on extension 4410."),
        item("draft", status=E.ITEM_STATUS_PROPOSED, questions=["Draft?"]),
    ]))
    answers = {"v1": {"Which form for returns?": "Form RF-7734.", "What do I fill in to return boots?": "A form."},
               "v2": {"Which form for returns?": "Form RF-7734.", "What do I fill in to return boots?": "RF-7734",
                      "Which extension reaches repairs?": "Call 4410."}}
    ev = AnsweringEvaluator(store, WeightsSettings(store=LocalStoreSettings(dir=store.root)), view, answers)
    upload({"model.safetensors": tensor_file(1)}, tenant="acme")
    upload({"model.safetensors": tensor_file(2)}, tenant="acme")

    v1 = ev.evaluate(store.get("m", "v1"))
    assert v1.status == weights_pb2.VERSION_STATUS_APPROVED, v1.status_reason       # nothing held: not blocking
    k1 = {r.metric: r for r in v1.eval_results if r.suite == KNOWLEDGE}
    assert set(k1) == {"item:acme/support:form@1", "item:acme/support:ext@2"}
    form = k1["item:acme/support:form@1"]
    assert (form.candidate, form.passed, form.detail, form.threshold) == (0.5, False, "not held: A form.", 1.0)
    assert math.isnan(form.baseline)                                            # parent base: never gated
    assert "knowledge (informational, never blocks): 0 of 2 items held" in v1.status_reason
    # asked as the held-out set is: its system prompt (the task's), the question, and no knowledge at all
    system = ev.heldout.spec.system
    assert ev.asked[0] == ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": "What do I fill in to return boots?"}]
    assert not any("RF-7734" in m["content"] or "reference-notes" in m["content"] for c in ev.asked for m in c)

    OrderDesk(store, Recorder()).promote("m", "v1")
    v2 = ev.evaluate(store.get("m", "v2"))
    k2 = {r.metric: r for r in v2.eval_results if r.suite == KNOWLEDGE}
    assert all(r.passed and r.detail == "held" for r in k2.values())
    assert k2["item:acme/support:form@1"].baseline == 0.5                        # v1's share, from its manifest
    assert "2 of 2 items held" in v2.status_reason

    ev.settings = ev.settings.model_copy(update={"knowledge_max_items": 1})     # the bound: newest first
    upload({"model.safetensors": tensor_file(3)}, tenant="acme")
    ev.table["v3"] = scores(0.02)
    ev.answers["v3"] = {}
    v3 = ev.evaluate(store.get("m", "v3"))
    assert [r.metric for r in v3.eval_results if r.suite == KNOWLEDGE] == ["item:acme/support:form@1"]
