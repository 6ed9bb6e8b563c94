"""Broker down --> spool --> broker up --> every event delivered exactly once (in-process and after a restart).

Runs its own single-node broker on free ports (never the shared one): the test stops and starts it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from services.inference.client import InferenceClient
from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.inference import start_inference
from tests.helpers.kafka import collect, private_broker

pytestmark = pytest.mark.integration


def test_broker_outage_spools_and_replays_exactly_once(kafka_bootstrap: str, tmp_path: Path, tiny_model_name: str) -> None:
    # kafka_bootstrap: the session broker's admin in the environment, which the private broker shares (private_broker)
    broker = private_broker(tmp_path / "broker")
    broker.start(timeout=120)
    topics = Topics(prefix=f"spool-{uuid.uuid4().hex[:6]}.")
    apps = []
    try:
        ensure_topics(broker.bootstrap, topics)
        spool_home = tmp_path / "pod"
        kw: dict[str, Any] = dict(model=tiny_model_name, bootstrap=broker.bootstrap, topic_prefix=topics.prefix,
                  follow_updates=False, heartbeat_interval_s=0, pod_id="spool-pod", grace_s=2)
        app = start_inference(spool_home, **kw)
        apps.append(app)
        ids: list[str] = []
        with InferenceClient(f"127.0.0.1:{app.port}") as c:
            ids += [c.generate(f"before {i}", max_new_tokens=3, session_id=f"s{i % 2}").choices[0].interaction_id
                    for i in range(4)]
            assert app.capture.wait_idle(30)

            broker.stop(timeout=2)                                   # the broker dies
            t0 = time.monotonic()
            ids += [c.generate(f"during {i}", max_new_tokens=3, session_id=f"s{i % 2}").choices[0].interaction_id
                    for i in range(6)]
            assert time.monotonic() - t0 < 30                        # requests never wait on Kafka
            assert not app.capture.wait_idle(1.0) and app.capture.depth == 6
        app.stop(1)                                                  # restart while the broker is still down
        assert any(spool_home.joinpath("spool").glob("*.seg"))

        app2 = start_inference(spool_home, **kw)
        apps.append(app2)
        with InferenceClient(f"127.0.0.1:{app2.port}") as c:
            ids += [c.generate(f"after restart {i}", max_new_tokens=3).choices[0].interaction_id for i in range(3)]
            assert app2.capture.depth == 9                           # 6 from the spool + 3 new
            fb = c.feedback(ids[0], "thumbs", -1)

        broker.start(timeout=120)                                    # the broker returns
        assert app2.capture.wait_idle(90)
        # every record (and any duplicate) is on the broker once acknowledged: a short read finds them all
        events = collect(broker.bootstrap, topics.interactions, events_pb2.Interaction, count=len(ids) + 5,
                         timeout=6)
        counts = Counter(e.envelope.event_id for e in events)
        assert sorted(e.interaction_id for e in events) == sorted(ids)        # nothing lost ...
        assert max(counts.values()) == 1                                      # ... nothing twice
        by_session: dict[str, list[str]] = {}
        for e in events:
            by_session.setdefault(e.session_id, []).append(e.interaction_id)
        order = {iid: n for n, iid in enumerate(ids)}
        sessions = [k for k in by_session if k]          # s0, s1 as their pseudonyms (never the raw ids)
        assert not {"s0", "s1"} & set(sessions)
        assert sorted(len(by_session[k]) for k in sessions)[-2:] == [5, 5]   # s0 and s1: 2 before + 3 during
        for session in sessions:                                             # per-key order is kept
            seq = [order[i] for i in by_session[session]]
            assert seq == sorted(seq)
        feedback = collect(broker.bootstrap, topics.feedback, events_pb2.FeedbackEvent, count=1, timeout=10)
        assert [f.envelope.event_id for f in feedback] == [fb.event_id]
    finally:
        for a in apps:
            with contextlib.suppress(Exception):
                a.stop(1)
        broker.stop(timeout=2)


def test_feedback_is_acknowledged_only_once_it_is_on_disk(tmp_path: Path, tiny_model_name: str) -> None:
    """A Feedback ack promises the event survives a crash of the pod: with a spool that takes nothing (full),
    the call fails UNAVAILABLE (the client retries) instead of acknowledging an event held in memory only;
    an answer is still returned and its missed capture counted."""
    import grpc
    from prometheus_client import REGISTRY

    app = start_inference(tmp_path, model=tiny_model_name, bootstrap="127.0.0.1:1", follow_updates=False,
                          heartbeat_interval_s=0, spool_max_bytes=64, spool_segment_bytes=64,
                          capture_ack_timeout_s=0.5, startup_catchup_s=0.5, grace_s=1)
    try:
        unspooled = REGISTRY.get_sample_value("apprentice_inference_capture_unspooled_total") or 0.0
        with InferenceClient(f"127.0.0.1:{app.port}") as c:
            iid = c.generate("hello", max_new_tokens=3).choices[0].interaction_id
            with pytest.raises(grpc.RpcError) as err:
                c.feedback(iid, "thumbs", 1)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "retry" in (err.value.details() or "")
        assert REGISTRY.get_sample_value("apprentice_inference_capture_unspooled_total") == unspooled + 1
    finally:
        app.stop(1)
