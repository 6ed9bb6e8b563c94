"""Operator surface over real gRPC: approve / reject / pin / edit change what the next snapshot offers to
training (read back from the real knowledge topic), tenancy and validation errors, and the CLI."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest

from services.extractor import cli
from services.extractor.curation import approx_tokens
from services.extractor.knowledge import training_view
from services.extractor.llm_local import LocalLLM
from services.extractor.service import ExtractorApp
from services.extractor.settings import ExtractorSettings
from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2, knowledge_pb2, knowledge_pb2_grpc
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.unit.extractor.factories import graded

pytestmark = pytest.mark.integration
KEY = "acme/support"
S = events_pb2.ItemStatus
ACME = (("x-apprentice-tenant", "acme"),)
"""Reads name their tenant: this server runs without keys, and anonymous reads without a tenant see nothing."""


@pytest.fixture
def running(topics: Topics, kafka_bootstrap: str, tiny_model_name: str) -> Iterator[tuple[ExtractorApp, knowledge_pb2_grpc.KnowledgeStub]]:
    settings = ExtractorSettings(port=0, host="127.0.0.1", metrics_port=0, session_gap_s=0.0,
                                 group_id=f"extractor-{uuid.uuid4().hex[:6]}", max_new_tokens=16,
                                 require_approval_tenants=["acme"], grace_s=1.0)
    app = ExtractorApp(settings, LocalLLM(tiny_model_name), count_tokens=approx_tokens)
    app.start(consume=True)
    port = app.port
    p = signed_producer(kafka_bootstrap, "grader")   # graded records are the grader's
    for i, corr in enumerate(["The warranty lasts 24 months.", "Use form R-12 within 30 days.", "Billing is extension 4417."]):
        p.produce(topics.graded, f"s{i}", graded(session=f"s{i}", iid=f"i{i}", question=f"Question number {i}?", correction=corr))
    p.flush()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = knowledge_pb2_grpc.KnowledgeStub(channel)

    def built() -> bool:
        snap = app.store.latest(KEY)
        return snap is not None and sum(it.created_by == "correction" for it in snap.items) == 3

    wait_for(built, what="the extractor to build the base", stall_s=40, every=0.2)
    yield app, stub
    channel.close()
    app.stop()


def latest_on_topic(bootstrap: str, topics: Topics) -> events_pb2.KnowledgeSnapshot:
    snaps = [decode(events_pb2.KnowledgeSnapshot, m.value()) for m in read_all(bootstrap, topics.knowledge, idle=1.0, timeout=10)]
    return max((s for s in snaps if s.key == KEY), key=lambda s: s.version)


def test_approve_reject_pin_edit_change_the_training_view(running: tuple, topics: Topics, kafka_bootstrap: str) -> None:
    app, stub = running
    base = stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY), metadata=ACME)
    items = [it for it in base.items if it.created_by == "correction"]
    assert base.require_approval and all(it.status == S.ITEM_STATUS_PROPOSED for it in base.items)
    assert len(stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY, training_view=True), metadata=ACME).items) == 0
    assert len(training_view(latest_on_topic(kafka_bootstrap, topics)).items) == 0   # what a trainer sees

    a, b, c = (it.item_id for it in items)
    s1 = stub.Approve(knowledge_pb2.ItemActionRequest(key=KEY, item_id=a, operator="olga"))
    s2 = stub.Reject(knowledge_pb2.ItemActionRequest(key=KEY, item_id=b, operator="olga"))
    s3 = stub.Pin(knowledge_pb2.ItemActionRequest(key=KEY, item_id=c, operator="olga"))
    assert (s1.version, s2.version, s3.version) == (base.version + 1, base.version + 2, base.version + 3)
    view = stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY, training_view=True), metadata=ACME)
    assert sorted(it.item_id for it in view.items) == sorted([a, c])
    on_topic = latest_on_topic(kafka_bootstrap, topics)
    assert on_topic.version == s3.version and sorted(it.item_id for it in training_view(on_topic).items) == sorted([a, c])
    # every review action is on the audit topic, with the caller (anonymous: this server has no keys)
    audits = [decode(events_pb2.AuditRecord, m.value()) for m in read_all(kafka_bootstrap, topics.audit, expect=3,
                                                                          idle=1.0, timeout=20)]
    assert [(r.action, r.target) for r in audits] == [("knowledge.approve", f"{KEY}#{a}"),
                                                        ("knowledge.reject", f"{KEY}#{b}"),
                                                        ("knowledge.pin", f"{KEY}#{c}")]
    assert all(r.allowed and r.envelope.tenant == "acme" and r.envelope.principal.role == "anonymous"
               and r.details["operator"] == "olga" for r in audits)
    assert {it.item_id: it.edited_by for it in on_topic.items}[b] == "olga"
    # provenance through the API: created from the interaction, then reviewed by the caller (anonymous here)
    trail = {it.item_id: [(p.action, p.principal.role) for p in it.provenance] for it in view.items}
    assert trail[a][0][0] == "created" and trail[a][-1] == ("approved", "anonymous") and trail[c][-1][0] == "pinned"

    s4 = stub.Edit(knowledge_pb2.EditItemRequest(key=KEY, item_id=a, text="Warranty: 24 months for every device.",
                                                 operator="olga"))
    assert [it.text for it in s4.items if it.item_id == a] == ["Warranty: 24 months for every device."]
    # an older version stays readable by number
    assert stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY, version=base.version), metadata=ACME) == base
    assert list(stub.List(knowledge_pb2.ListKnowledgeRequest()).bases) == []      # no tenant named: nothing
    [summary] = stub.List(knowledge_pb2.ListKnowledgeRequest(tenant="acme")).bases
    assert (summary.key, summary.version, summary.training_count, summary.rejected_count) == (KEY, s4.version, 2, 1)

    # the CLI prints it readably, and can approve
    out = cli_run(["--endpoint", f"127.0.0.1:{app.port}", "show", KEY])
    assert f"{KEY}  version {s4.version}" in out and "[serving in context]" in out and "Warranty: 24 months for every device." in out
    assert "approval: required" in out and "by correction" in out
    assert "pinned by anonymous:anonymous" in out and "created by unknown:?" in out      # provenance shown
    cli_out = cli_run(["--endpoint", f"127.0.0.1:{app.port}", "approve", KEY, b, "--operator", "cli-user"])
    assert f"approved {b}" in cli_out
    assert len(stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY, training_view=True), metadata=ACME).items) == 3
    assert "no knowledge bases visible" in cli_run(["--endpoint", f"127.0.0.1:{app.port}", "list"])
    listing = cli_run(["--endpoint", f"127.0.0.1:{app.port}", "list", "--tenant", "acme"])
    assert KEY in listing and "required" in listing
    offline = cli_run(["show", KEY, "--from-topic"])
    assert f"version {s4.version + 1}" in offline


def test_errors_and_tenancy(running: tuple) -> None:
    _app, stub = running
    with pytest.raises(grpc.RpcError) as e:
        stub.Get(knowledge_pb2.GetKnowledgeRequest(key="no-slash"), metadata=ACME)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        stub.Get(knowledge_pb2.GetKnowledgeRequest(key="acme/unknown"), metadata=ACME)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        stub.Approve(knowledge_pb2.ItemActionRequest(key=KEY, item_id="missing"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        stub.Edit(knowledge_pb2.EditItemRequest(key=KEY, item_id="x", text=""))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # an item id of a megabyte of special tokens: refused by its length, before any audit record or lookup
    with pytest.raises(grpc.RpcError) as e:
        stub.Approve(knowledge_pb2.ItemActionRequest(key=KEY, item_id="<|im_end|>" * 100_000, operator="olga"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "item_id must be at most" in e.value.details()
    other = (("x-apprentice-tenant", "beta"),)
    with pytest.raises(grpc.RpcError) as e:
        stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY))             # an anonymous read names no tenant
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "x-apprentice-tenant: acme" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Get(knowledge_pb2.GetKnowledgeRequest(key=KEY), metadata=other)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert list(stub.List(knowledge_pb2.ListKnowledgeRequest(), metadata=other).bases) == []
    assert [b.key for b in stub.List(knowledge_pb2.ListKnowledgeRequest(), metadata=(("x-apprentice-tenant", "acme"),)).bases] == [KEY]


def cli_run(argv: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    assert rc == 0, buf.getvalue()
    return buf.getvalue()
