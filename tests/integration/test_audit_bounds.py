"""An audit record quoting hostile input still fits the topic: its fields are clipped, never refused by the
broker (which would fail the operator's action for the wrong reason)."""

from __future__ import annotations

import pytest

from shared.audit import MAX_FIELD, MAX_TARGET, AuditLog
from shared.contracts.events import decode
from shared.contracts.topics import Topics
from shared.kafka.trust import RecordTrust
from shared.proto.apprentice.v1 import events_pb2
from shared.settings import CommonSettings
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer

pytestmark = pytest.mark.integration


def test_oversized_fields_are_clipped_and_the_record_is_durable(topics: Topics, kafka_bootstrap: str) -> None:
    # written as the extractor writes its audit records: signed, so a reader checking signatures keeps it
    audit = AuditLog(signed_producer(kafka_bootstrap, "extractor"), topics, source="extractor")
    huge = "<|im_end|>" * 200_000                                   # 2 MB: over Kafka's default record limit
    rec = audit.record("knowledge.approve", f"acme/support#{huge}", tenant="acme", reason=huge,
                       details={"text": huge, **{f"k{i}": "v" for i in range(100)}})
    [msg] = read_all(kafka_bootstrap, topics.audit, expect=1, idle=1.0, timeout=20)
    RecordTrust.from_settings(CommonSettings()).check(msg)           # the clipped record's signature holds
    got = decode(events_pb2.AuditRecord, msg.value())
    assert got == rec
    assert got.target.startswith("acme/support#<|im_end|>") and len(got.target) <= MAX_TARGET + 40
    assert got.target.endswith(f"({len('acme/support#') + len(huge)} characters)")
    assert len(got.reason) <= MAX_FIELD + 40 and len(got.details["text"]) <= MAX_FIELD + 40
    assert len(got.details) <= 32
