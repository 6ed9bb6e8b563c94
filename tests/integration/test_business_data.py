"""A support desk can teach its own phone number: the backend's corrections that carry the tenant's declared
public business data (APPRENTICE_BUSINESS_DATA) reach the knowledge base unredacted, through the real
inference server (gRPC on loopback, capture to the real broker, the tiny model) and the real extractor on the
same broker; the same corrections for another tenant, and the end user's own number, arrive redacted.

The second unseen task of the issue: "Call customer service on 0800 414 2277" and "Write to found@... about
lost property" reached the knowledge base as `<PHONE_NUMBER>` and `<EMAIL_ADDRESS>` and waited as pending
items. The graded records are assembled here from what the inference server captured on `interactions` and
`feedback`, as the grader joins them (no reward is at stake: the extractor reads the correction text).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.extractor.curation import approx_tokens
from services.extractor.llm_local import LocalLLM
from services.extractor.service import ExtractorApp
from services.extractor.settings import ExtractorSettings
from services.inference.client import InferenceClient
from shared.contracts.events import deterministic_id, make_envelope
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.inference import start_inference
from tests.helpers.kafka import collect
from tests.helpers.signing import signed_producer

pytestmark = pytest.mark.integration

PHONE, EMAIL = "0800 414 2277", "found@trailmate.co.uk"
DECLARED = {"acme": {"phones": ["+44 800 414 2277"], "emails": [EMAIL]}}
"""acme's public business data; globex declares nothing."""
USER_PHONE, USER_EMAIL = "07700 900123", "jane.roe@gmail.com"
EXCHANGES = [
    (f"hw do i call u guys?? my number is {USER_PHONE}", f"Call customer service on {PHONE}."),
    (f"lost my jacket on the train, mail me at {USER_EMAIL}", f"Write to {EMAIL} about lost property."),
]


@pytest.fixture
def app(topics: Topics, kafka_bootstrap: str, tiny_model_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # the deployment's configuration, read by every service that redacts (this process builds both)
    monkeypatch.setenv("APPRENTICE_BUSINESS_DATA", json.dumps(DECLARED))
    a = start_inference(tmp_path / "inference", model=tiny_model_name, bootstrap=kafka_bootstrap,
                        topic_prefix=topics.prefix, follow_updates=False, heartbeat_interval_s=0)
    yield a
    a.stop(2)


def served_and_corrected(app: Any, tenant: str) -> list[tuple[str, str]]:
    """Each exchange asked and corrected by the backend for `tenant`: (interaction id, feedback event id)."""
    out = []
    with InferenceClient(f"127.0.0.1:{app.port}", tenant=tenant) as c:
        for question, correction in EXCHANGES:
            iid = c.generate([{"role": "user", "content": question}], max_new_tokens=6,
                             task="support").choices[0].interaction_id
            ack = c.feedback(iid, "correction", comment=correction)
            assert ack.accepted
            out.append((iid, ack.event_id))
    return out


def graded_from_capture(interaction: events_pb2.Interaction, feedback: events_pb2.FeedbackEvent
                        ) -> events_pb2.GradedInteraction:
    """The grader's record of an interaction joined with its correction (revision 1, the correction's reward)."""
    tenant = interaction.envelope.tenant
    return events_pb2.GradedInteraction(
        envelope=make_envelope(tenant, source="grader", event_id=deterministic_id(interaction.interaction_id, "1")),
        interaction=interaction, revision=1, reward=-1.0, has_signal=True, success=False, feedback=[feedback],
        components=[events_pb2.RewardComponent(name="corrected", value=-1.0, weight=1.0, has_signal=True,
                                               detail="correction")])


def test_a_correction_with_the_tenants_declared_phone_reaches_the_knowledge_base_unredacted(
        app: Any, topics: Topics, kafka_bootstrap: str, tiny_model_name: str) -> None:
    served = {tenant: served_and_corrected(app, tenant) for tenant in ("acme", "globex")}
    iids = [i for pairs in served.values() for i, _ in pairs]
    events = [e for e in collect(kafka_bootstrap, topics.interactions, events_pb2.Interaction, want=iids)
              if e.interaction_id in iids]
    fb = [f for f in collect(kafka_bootstrap, topics.feedback, events_pb2.FeedbackEvent,
                             want=[e for pairs in served.values() for _, e in pairs], key=lambda m: m.envelope.event_id)
          if f.interaction_id in iids]
    interactions = {e.interaction_id: e for e in events}
    comments = {f.interaction_id: f for f in fb}
    assert set(interactions) == set(comments) == set(iids)

    # on the topics: acme's corrections as its backend wrote them, globex's redacted, the user's data redacted
    for tenant, pairs in served.items():
        for (iid, _), (question, correction) in zip(pairs, EXCHANGES, strict=True):
            user = [m.content for m in interactions[iid].messages if m.role == "user"][0]
            assert user == question.replace(USER_PHONE, "<PHONE_NUMBER>").replace(USER_EMAIL, "<EMAIL_ADDRESS>")
            if tenant == "acme":
                assert comments[iid].comment == correction
            else:
                assert PHONE not in comments[iid].comment and EMAIL not in comments[iid].comment
    assert comments[served["globex"][0][0]].comment == "Call customer service on <PHONE_NUMBER>."
    assert comments[served["globex"][1][0]].comment == "Write to <EMAIL_ADDRESS> about lost property."

    # the extractor, configured as the inference server is, reads the graded records off the broker
    p = signed_producer(kafka_bootstrap, "grader")   # graded records are the grader's
    for iid in iids:
        p.produce(topics.graded, interactions[iid].session_id, graded_from_capture(interactions[iid], comments[iid]))
    p.flush()
    llm = LocalLLM(tiny_model_name)
    settings = ExtractorSettings(port=0, metrics_port=0, group_id=f"extractor-{uuid.uuid4().hex[:6]}",
                                 session_gap_s=0.0, max_new_tokens=24, rate_limit_per_s=100, rate_burst=100)
    assert settings.common.business_data == DECLARED
    ex = ExtractorApp(settings, llm, count_tokens=approx_tokens)
    try:
        ex.rebuild()

        def from_corrections(key: str) -> set[str]:
            snap = ex.store.latest(key)
            return {it.text for it in snap.items if it.created_by == "correction"} if snap is not None else set()

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (len(from_corrections("acme/support")) >= 2
                                                   and len(from_corrections("globex/support")) >= 2):
            ex.poll_once()
        acme, globex = from_corrections("acme/support"), from_corrections("globex/support")
    finally:
        ex.stop()
    acme, globex = from_corrections("acme/support"), from_corrections("globex/support")
    assert acme == {correction for _, correction in EXCHANGES}, (acme, ex.store.base_keys())
    assert globex == {"Call customer service on <PHONE_NUMBER>.", "Write to <EMAIL_ADDRESS> about lost property."}
    snap = ex.store.latest("acme/support")
    assert snap is not None and not any(USER_PHONE in it.text or USER_EMAIL in it.text for it in snap.items)
