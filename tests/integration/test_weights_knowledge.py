"""The eval gate's knowledge checks with the real broker and the tiny model: the weights service follows the
knowledge topic from its beginning, gates a tenant's candidate (from a CheckpointPublished), and records one
informational result per approved item of that tenant, next to the parent and reference comparisons; an
item the candidate does not hold does not stop its promotion."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from services.weights.service import start
from services.weights.settings import LocalStoreSettings, WeightsSettings
from shared.contracts.events import make_envelope
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc
from shared.weights.client import save_version_files, upload_version
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.integration.weights_evalsets import small_eval_sets

pytestmark = pytest.mark.integration
MODEL = "tiny-random"
E = events_pb2


def _item(item_id: str, status: int, questions: list[str], terms: list[str]) -> events_pb2.KnowledgeItem:
    return E.KnowledgeItem(item_id=item_id, text=f"item {item_id}", status=status, questions=questions,  # type: ignore[arg-type]
                           answer_terms=terms, revision=2)


def test_gate_checks_the_tenants_approved_items(topics: Topics, kafka_bootstrap: str, tmp_path: Path,
                                                tiny_model_name: str) -> None:
    from shared.models import load_model

    model, _ = load_model(tiny_model_name)
    save_version_files(model, tmp_path / "ckpt", "full")

    p = signed_producer(kafka_bootstrap, "extractor")
    items = [_item("form", E.ITEM_STATUS_APPROVED, ["Which form do I need to return boots?", "Return paperwork?"],
                   ["RF-7734"]),
             _item("draft", E.ITEM_STATUS_PROPOSED, ["Draft question?"], ["4410"])]
    for version, its in ((1, items[:1]), (2, items)):       # two versions of one base: the highest is current
        p.produce(topics.knowledge, "default/support", E.KnowledgeSnapshot(
            envelope=make_envelope("default", source="test-extractor"), key="default/support", domain="support",
            version=version, items=its))
    # a record that writes into another tenant's base: ignored
    p.produce(topics.knowledge, "other/support", E.KnowledgeSnapshot(
        envelope=make_envelope("default", source="test-extractor"), key="other/support", domain="support",
        version=1, items=[_item("foreign", E.ITEM_STATUS_APPROVED, ["Q?"], ["X-1"])]))
    p.flush()

    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"), policy="auto",
                               consumer_group=f"weights-{uuid.uuid4().hex[:6]}", eval_max_new_tokens=8,
                               **small_eval_sets(tmp_path / "sets"))  # type: ignore[arg-type]
    server = start(settings)
    try:
        stub = weights_pb2_grpc.WeightsStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
        view = server.service.knowledge
        assert view is not None
        wait_for(lambda: view.wait_ready(0), what="knowledge view caught up")
        assert [c.item_id for c in view.items_for("default", 40)] == ["form"]
        assert view.ignored_other_tenant == 1

        m = upload_version(stub, weights_pb2.UploadHeader(model=MODEL, kind="full", tenant="default"), tmp_path / "ckpt")
        ev = E.CheckpointPublished(envelope=make_envelope("default", source="test-trainer"), model=MODEL,
                                   version=m.version, kind="full", tenant="default")
        trainer = signed_producer(kafka_bootstrap, "trainer")
        trainer.produce(topics.checkpoints, MODEL, ev)
        trainer.flush()
        trainer.close()
        get = lambda: stub.Get(weights_pb2.GetVersionRequest(model=MODEL, version=m.version))  # noqa: E731
        got = wait_for(lambda: (v := get()).status == weights_pb2.VERSION_STATUS_PROMOTED and v, stall_s=120,
                       what="candidate gated and promoted")
    finally:
        server.stop(grace=1.0)

    knowledge = [r for r in got.eval_results if r.suite == "knowledge"]
    assert [r.metric for r in knowledge] == ["item:default/support:form@2"]
    (r,) = knowledge
    assert r.threshold == 1.0 and r.candidate in (0.0, 0.5, 1.0) and r.detail.startswith(("held", "not held: "))
    assert r.passed == (r.candidate == 1.0)
    comparisons = {(x.suite, x.metric, x.comparison, x.baseline_version) for x in got.eval_results if x.comparison}
    assert comparisons == {(s, mt, c, "base") for s, mt in (("heldout", "rule_score"), ("ood", "ref_loglik"),
                                                            ("ood", "repetition"), ("ood", "rule_score"))
                           for c in ("parent", "reference")}
    # promoted whether or not the random tiny model holds the item: knowledge results never block
