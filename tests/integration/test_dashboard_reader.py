"""The dashboard's topic reader applies the checks every consumer applies: a record with a non-finite reward
(or of another type) on the graded topic is counted and skipped, and the pages' JSON stays valid."""

from __future__ import annotations

import json

import pytest

from services.dashboard.aggregates import GradedFold, UpdatesFold
from services.dashboard.reader import TopicReader
from shared.contracts.topics import Topics
from shared.kafka import EventProducer
from shared.settings import CommonSettings
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.unit.dashboard.test_aggregates import graded

pytestmark = pytest.mark.integration


def test_non_finite_and_mistyped_records_are_skipped(topics: Topics, kafka_bootstrap: str) -> None:
    p = signed_producer(kafka_bootstrap, "grader")       # the graded topic's writer
    p.produce(topics.graded, "s1", graded("good", t=0.0, reward=1.0, success=True))
    p.produce(topics.graded, "s2", graded("nan", t=1.0, reward=float("nan")))
    p.produce(topics.graded, "s3", graded("inf", t=2.0, reward=float("inf")))
    p.produce(topics.graded, b"s4", b"\xff\xfe not a protobuf")
    p.flush()
    # forged: unsigned, and signed by a principal that may not write graded records; skipped and counted
    forger = EventProducer(kafka_bootstrap, client_id="attacker")
    forger.produce(topics.graded, "s5", graded("forged-unsigned", t=3.0, reward=1.0, success=True))
    forger.flush()
    inference = signed_producer(kafka_bootstrap, "inference")
    inference.produce(topics.graded, "s6", graded("forged-inference", t=4.0, reward=1.0, success=True))
    inference.flush()
    fold = GradedFold(bucket_s=60.0)
    reader = TopicReader(CommonSettings(kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix), fold,
                         UpdatesFold()).start()
    try:
        # the records sit on different partitions: the good one may be read after the bad ones
        wait_for(lambda: reader.undecodable >= 3 and reader.untrusted >= 2
                 and any(s["n"] for c in fold.curves() for s in c["series"]),
                 what="five records skipped and the good one folded", stall_s=30, every=0.2,
                 detail=lambda: f"undecodable: {reader.undecodable}, untrusted: {reader.untrusted}")
        assert (reader.undecodable, reader.untrusted) == (3, 2)
        curves = fold.curves()
        json.dumps(curves, allow_nan=False)          # what the page is served: valid JSON
        [curve] = curves
        assert sum(s["n"] for s in curve["series"]) == 1
    finally:
        reader.stop()
