"""PII never leaves the inference edge unredacted: real gRPC on loopback, the real broker, the tiny model.

The attack this closes: an e-mail address, a card number written with dots and a name given only in a
correction reached `interactions`, `feedback` (hence `graded`) and the on-disk spool as sent. Here they go
in through a chat prompt, a raw prompt, a streamed prompt and a correction comment; the topics and the
spool files must hold only placeholders. A `keep` tenant's raw values do reach the spool: the scan would
see a leak. A `reject` tenant gets INVALID_ARGUMENT naming the types, never the values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from services.inference.client import InferenceClient
from shared.contracts.topics import Topics
from shared.privacy.policy import Redactor
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.inference import spool_bytes, start_inference
from tests.helpers.kafka import collect, topic_namespace
from tests.helpers.privacy import CountingDetector

pytestmark = pytest.mark.integration

EMAIL, CARD, NAME, CORRECTION_NAME = "dana.w@example.com", "4111.1111.1111.1111", "Dana Whitfield", "Priya Raman"
SECRETS = (EMAIL, CARD, NAME, "Whitfield", CORRECTION_NAME, "Raman")
PROMPT = f"Hi, my name is {NAME}. Please refund my card {CARD} and confirm to {EMAIL}."
CORRECTION = f"The account holder is {CORRECTION_NAME}; refund card {CARD} and mail {EMAIL}."


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    with topic_namespace(kafka_bootstrap, "pii") as t:
        yield t


@pytest.fixture(scope="module")
def app(ns: Topics, kafka_bootstrap: str, tiny_model_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    a = start_inference(tmp_path_factory.mktemp("inference-pii"), model=tiny_model_name, bootstrap=kafka_bootstrap,
                        topic_prefix=ns.prefix, follow_updates=False, heartbeat_interval_s=0,
                        pii_tenant_policies="open:keep,strict:reject")      # everyone else: redact (default)
    yield a
    a.stop(2)


@pytest.fixture(scope="module")
def client(app: Any) -> Iterator[InferenceClient]:
    with InferenceClient(f"127.0.0.1:{app.port}", tenant="acme") as c:
        yield c


def leaked(data: bytes | str) -> list[str]:
    raw = data if isinstance(data, bytes) else data.encode()
    return [s for s in SECRETS if s.encode() in raw]


def test_prompts_and_corrections_reach_topics_and_spool_redacted(app: Any, client: InferenceClient,
                                                                 kafka_bootstrap: str, ns: Topics) -> None:
    chat = client.generate([{"role": "user", "content": PROMPT}], max_new_tokens=6, temperature=1.0, n=2, seed=5)
    raw = client.generate(prompt=PROMPT, max_new_tokens=6)
    chunks = list(client.generate_stream([{"role": "user", "content": PROMPT}], max_new_tokens=6))
    ids = [c.interaction_id for c in chat.choices] + [raw.choices[0].interaction_id, chunks[0].interaction_id]
    ack = client.feedback(ids[0], "correction", comment=CORRECTION)
    thumbs = client.feedback(ids[1], "thumbs", -1, comment=f"wrong, I am {NAME}")
    assert ack.accepted and thumbs.accepted

    got = collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=ids)
    events = {e.interaction_id: e for e in got if e.interaction_id in ids}
    assert set(events) == set(ids)
    tok = app.engine.tokenizer
    for e in events.values():
        assert not leaked(e.SerializeToString()), e
        assert not leaked(tok.decode(list(e.prompt_token_ids)))      # the trainer's prompt is redacted too
        user = [m.content for m in e.messages if m.role == "user"][0]
        assert "<EMAIL_ADDRESS>" in user and "<CREDIT_CARD>" in user and "<PERSON>" in user
        assert "<EMAIL_ADDRESS>" in e.prompt_text
    fb = collect(kafka_bootstrap, ns.feedback, events_pb2.FeedbackEvent, want=[ack.event_id, thumbs.event_id],
                 key=lambda m: m.envelope.event_id)
    by_id = {f.envelope.event_id: f for f in fb}
    assert by_id[ack.event_id].comment == "The account holder is <PERSON>; refund card <CREDIT_CARD> and mail " \
                                          "<EMAIL_ADDRESS>."
    assert by_id[thumbs.event_id].comment == "wrong, I am <PERSON>"
    assert not leaked(b"".join(f.SerializeToString() for f in fb))

    disk = spool_bytes(app)
    assert b"<CREDIT_CARD>" in disk, "the spool files hold the captured records (delivered ones stay in the segment)"
    assert not leaked(disk)


def test_keep_tenant_is_captured_as_sent(app: Any, client: InferenceClient, kafka_bootstrap: str, ns: Topics) -> None:
    # other values than SECRETS, so the redacted tenants' checks hold in any test order
    prompt = "I'm Olga Ivanova, card 5555.5555.5555.4444, mail olga.i@example.org."
    iid = client.generate(prompt=prompt, max_new_tokens=4, tenant="open").choices[0].interaction_id
    [e] = [x for x in collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[iid])
           if x.interaction_id == iid]
    assert e.prompt_text == prompt
    assert b"5555.5555.5555.4444" in spool_bytes(app), "a keep tenant's text reaches the spool as sent (the " \
                                                       "spool scan sees what is there)"


def test_reject_tenant_gets_invalid_argument_naming_types(client: InferenceClient) -> None:
    with pytest.raises(grpc.RpcError) as e:
        client.generate(prompt=PROMPT, max_new_tokens=4, tenant="strict")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CREDIT_CARD, EMAIL_ADDRESS, PERSON" in e.value.details() and not leaked(e.value.details())
    iid = client.generate(prompt="How long is the warranty?", max_new_tokens=4, tenant="strict").choices[0].interaction_id
    with pytest.raises(grpc.RpcError) as e:
        client.feedback(iid, "correction", comment=CORRECTION, tenant="strict")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "PERSON" in e.value.details()
    assert not leaked(e.value.details())




@pytest.mark.parametrize(("tenant", "prompt"), [("acme", PROMPT), ("strict", "How long is the warranty?")])
def test_each_text_of_a_served_request_is_read_by_the_detector_once(app: Any, client: InferenceClient,
                                                                    tenant: str, prompt: str) -> None:
    """Through the server's own wiring (edge screening, capture of n choices): with no cache to hide a
    repeat, the prompt and each answer reach the detector once per request, whatever the policy."""
    counting = CountingDetector()
    served = app.privacy.redactor
    app.privacy.redactor = Redactor(lambda: counting, cache_size=0)
    try:
        r = client.generate([{"role": "user", "content": prompt}], max_new_tokens=6, temperature=1.0, n=3, seed=7,
                            tenant=tenant)
    finally:
        app.privacy.redactor = served
    assert counting.calls == Counter([prompt, *(c.text for c in r.choices if c.text)])


DISGUISED = {                       # value -> the form it hides in (load/pii_disguises.py has more)
    "jane dot doe at example dot com": "spelled-out e-mail",
    "jane(at)example(dot)com": "bracketed at/dot",
    "４１１１ １１１１ １１１１ １１１１": "full-width digits",
    "+९१ ९८७६५ ४३२१०": "Devanagari digits",
    "4111-1111 1111.1111": "mixed separators",
    "DE89.3704.0044.0532.0130.00": "dotted IBAN",
    "3f2b9c1e-8d4a-4f6b-9e2d-7a1c5b8e0f93": "session id",
}


def test_disguised_personal_data_reaches_topics_and_spool_redacted(app: Any, client: InferenceClient,
                                                                   kafka_bootstrap: str, ns: Topics) -> None:
    """Each disguise in a chat prompt: neither the interactions topic nor the spool holds the value."""
    values = list(DISGUISED)
    prompt = ("Refund please. Mail jane dot doe at example dot com or jane(at)example(dot)com; card "
              f"{values[2]}, old card {values[4]}, phone {values[3]}, IBAN {values[5]}, "
              f"my session id is {values[6]}.")
    r = client.generate([{"role": "user", "content": prompt}], max_new_tokens=6)
    iid = r.choices[0].interaction_id
    got = [e for e in collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[iid])
           if e.interaction_id == iid]
    assert got
    topic, disk = got[0].SerializeToString(), spool_bytes(app)
    leaks = {DISGUISED[v]: where for v in values for where, data in (("topic", topic), ("spool", disk))
             if v.encode() in data}
    assert leaks == {}
