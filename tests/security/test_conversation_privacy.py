"""Personal data split across messages, and the caller's session id (the OpenAI `user` field), never reach
the topics or the spool as sent: real gRPC and HTTP on loopback, the real broker, the tiny model.

The attacks these close (issue #33): each message was scanned alone, so an e-mail, phone number or IBAN
sent in two halves ("my mail is jane.roe@exa" / "mple.org") passed both scans and reached `interactions`
and the spool whole-readable; and the session id, which the OpenAI `user` field becomes (often an e-mail
or account number), was kept verbatim as the record's field and its Kafka key. The captured record must
hold placeholders for the halves, and a keyed pseudonym (shared/security/pseudonyms.py) for the session.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from services.inference.client import InferenceClient
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import events_pb2
from shared.security.pseudonyms import PREFIX
from tests.helpers.inference import spool_bytes, start_inference
from tests.helpers.kafka import collect, consumer, topic_namespace
from tests.helpers.ports import free_port

pytestmark = pytest.mark.integration

SECRET = "test-interaction-id-secret-0123456789"

# value -> (the two messages a user sends it in, the two halves of the value in them)
SPLIT = {
    "jane.roe@example.org": (("My e-mail is jane.roe@exa", "mple.org, please write there."), ("jane.roe@exa", "mple.org")),
    "+44 20 7946 0958": (("Call me back on +44 20 79", "46 0958 after six."), ("+44 20 79", "46 0958")),
    "DE89370400440532013000": (("Refund to IBAN DE8937040044", "0532013000 thanks."), ("DE8937040044", "0532013000")),
}


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    with topic_namespace(kafka_bootstrap, "convpii") as t:
        yield t


@pytest.fixture(scope="module")
def app(ns: Topics, kafka_bootstrap: str, tiny_model_name: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("APPRENTICE_INTERACTION_ID_SECRET", SECRET)
        a = start_inference(tmp_path_factory.mktemp("inference-convpii"), model=tiny_model_name,
                            bootstrap=kafka_bootstrap, topic_prefix=ns.prefix, http_port=free_port(),
                            follow_updates=False, heartbeat_interval_s=0, pii_tenant_policies="open:keep")
    yield a
    a.stop(2)


@pytest.fixture(scope="module")
def client(app: Any) -> Iterator[InferenceClient]:
    with InferenceClient(f"127.0.0.1:{app.port}", tenant="acme") as c:
        yield c


def captured(bootstrap: str, ns: Topics, iid: str) -> events_pb2.Interaction:
    [e] = [x for x in collect(bootstrap, ns.interactions, events_pb2.Interaction, want=[iid]) if x.interaction_id == iid]
    return e


def keys_of(bootstrap: str, topic: str, iids: set[str], timeout: float = 30.0) -> dict[str, bytes]:
    """interaction id -> the Kafka key its record was written under."""
    c = consumer(bootstrap, group="convpii-keys")
    c.subscribe([topic])
    out: dict[str, bytes] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and set(out) != iids:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            ev = events_pb2.Interaction()
            ev.ParseFromString(m.value())
            if ev.interaction_id in iids:
                out[ev.interaction_id] = m.key() or b""
    finally:
        c.close()
    return out


@pytest.mark.parametrize("between", [False, True], ids=["adjacent", "across-an-answer"])
def test_values_split_across_two_user_messages_are_redacted(app: Any, client: InferenceClient, kafka_bootstrap: str,
                                                            ns: Topics, between: bool) -> None:
    for value, ((head, tail), halves) in SPLIT.items():
        middle = [{"role": "assistant", "content": "Could you finish that?"}] if between else []
        msgs = [{"role": "user", "content": head}, *middle, {"role": "user", "content": tail}]
        iid = client.generate(msgs, max_new_tokens=4).choices[0].interaction_id
        e = captured(kafka_bootstrap, ns, iid)
        first, last = e.messages[0].content, e.messages[-1].content
        record, disk = e.SerializeToString(), spool_bytes(app)
        for half in halves:
            assert half not in first + last, f"{value!r} split across messages was kept: {first!r} / {last!r}"
            assert half.encode() not in record, (value, half)
            assert half.encode() not in disk, (value, half)
        assert "<" in first and "<" in last


def test_split_value_of_a_keep_tenant_is_kept(app: Any, client: InferenceClient, kafka_bootstrap: str,
                                              ns: Topics) -> None:
    """The control: the same halves from a `keep` tenant reach the topic as sent (the check above can see them)."""
    (head, tail), _ = SPLIT["jane.roe@example.org"]
    iid = client.generate([{"role": "user", "content": head}, {"role": "user", "content": tail}], max_new_tokens=4,
                          tenant="open").choices[0].interaction_id
    e = captured(kafka_bootstrap, ns, iid)
    assert [m.content for m in e.messages] == [head, tail]


def test_session_id_and_openai_user_never_reach_topic_or_spool(app: Any, client: InferenceClient,
                                                               kafka_bootstrap: str, ns: Topics) -> None:
    session, user = f"jane.roe+{uuid.uuid4().hex[:6]}@example.org", f"acct-{uuid.uuid4().hex[:10]}"
    first = client.generate([{"role": "user", "content": "How long is the warranty?"}], max_new_tokens=4,
                            session_id=session)
    again = client.generate([{"role": "user", "content": "And for boots?"}], max_new_tokens=4, session_id=session)
    other = client.generate([{"role": "user", "content": "And for boots?"}], max_new_tokens=4, session_id=session,
                            tenant="open")
    assert first.session_id == session, "the caller still gets its own session id back"
    body = json.dumps({"model": app.model, "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4,
                       "user": user, "tenant": "acme"}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{app.settings.http_port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        http_iid = json.loads(r.read())["apprentice"]["interaction_ids"][0]

    iids = {first.choices[0].interaction_id, again.choices[0].interaction_id, other.choices[0].interaction_id, http_iid}
    events = {i: captured(kafka_bootstrap, ns, i) for i in iids}
    keys = keys_of(kafka_bootstrap, ns.interactions, iids)
    disk = spool_bytes(app)
    for raw in (session, user):
        assert raw.encode() not in disk, f"{raw!r} is in the spool"
        for i, e in events.items():
            assert raw.encode() not in e.SerializeToString(), f"{raw!r} is in captured record {i}"
            assert raw.encode() not in keys[i], f"{raw!r} is the Kafka key of {i}"
    s1, s2 = events[first.choices[0].interaction_id].session_id, events[again.choices[0].interaction_id].session_id
    assert s1 == s2 and s1.startswith(PREFIX), "one session keeps one pseudonym: consumers still group its turns"
    assert keys[first.choices[0].interaction_id] == s1.encode()
    assert events[other.choices[0].interaction_id].session_id != s1, "two tenants' equal session ids must not meet"
    assert events[http_iid].session_id.startswith(PREFIX)
