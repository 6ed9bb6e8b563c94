"""Hot swap end to end: the real Weights service (in-process, on loopback) stores the versions (uploaded
with the real client), publishes the ModelUpdate orders on the real broker and serves the downloads; the
tiny model's engine loads them.

A swap under concurrent load loses no request and attributes each answer to the version that produced
it; LoRA versions attach to the loaded base; canaries and tenant versions route as ordered; a version
that fails to verify (bit rot in the store), or an order for another tenant's version (forged on the
topic: the service never sends one), keeps the old version and is reported in the heartbeat; rollback;
a pod that missed an order converges on the heartbeat's desired state.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY

from services.inference.client import InferenceClient
from shared.contracts.events import make_envelope
from shared.contracts.topics import Topics
from shared.kafka.admin import delete_topics, ensure_topics
from shared.kafka.producer import EventProducer
from shared.proto.apprentice.v1 import events_pb2, weights_pb2
from tests.helpers.inference import start_inference
from tests.helpers.kafka import collect, read_to_end
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.helpers.weights import LocalWeights

pytestmark = pytest.mark.integration
P, C, R = events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_CANARY, events_pb2.UPDATE_ACTION_ROLLBACK


def _full(tmp: Path, name: str, model_name: str, scale: float) -> Path:
    from shared.models import load_model
    from shared.weights.client import save_version_files

    model, _ = load_model(model_name)
    g = torch.Generator().manual_seed(int(scale * 100))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    save_version_files(model, tmp / name, "full")
    return tmp / name


def _lora(tmp: Path, name: str, model_name: str, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model

    from shared.models import load_model
    from shared.weights.client import save_version_files

    base, _ = load_model(model_name)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
                                         init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 2.0, generator=g)
    save_version_files(pm, tmp / name, "lora")
    return tmp / name


@pytest.fixture(scope="module")
def ns(kafka_bootstrap: str) -> Iterator[Topics]:
    t = Topics(prefix=f"test-swap-{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, t)
    yield t
    with contextlib.suppress(Exception):   # best-effort cleanup: a slow broker must not fail the tests
        delete_topics(kafka_bootstrap, [s.name for s in t.specs()])


@pytest.fixture(scope="module")
def store(ns: Topics, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory,
          tiny_model_name: str) -> Iterator[LocalWeights]:
    """The real Weights service in the test namespace, holding v1 (full), l2 (LoRA), t3 and t4 (acme's
    LoRAs) and bad (a full version whose blob rots after its integrity check), all approved."""
    tmp = tmp_path_factory.mktemp("versions")
    w = LocalWeights(tmp / "store", common={"kafka_bootstrap": kafka_bootstrap, "topic_prefix": ns.prefix})
    m = tiny_model_name
    w.upload(m, _full(tmp, "v1", m, 0.3), kind="full", version="v1")
    w.upload(m, _lora(tmp, "l2", m, 2), kind="lora", version="l2", base_version="base")
    w.upload(m, _lora(tmp, "t3", m, 3), kind="lora", version="t3", base_version="base", tenant="acme")
    w.upload(m, _lora(tmp, "t4", m, 4), kind="lora", version="t4", base_version="base", tenant="acme")
    bad = w.upload(m, _full(tmp, "bad", m, 0.1), kind="full", version="bad")
    w.service.evaluator.check_integrity(bad)          # passed while intact; the service checks a version once
    for v in ("v1", "l2", "t3", "t4", "bad"):
        w.approve(m, v)
    # then bit rot in the store: same size, other bytes (the weights file: its config is the same blob as
    # every other version's, the store deduplicates by content)
    [weights] = [f for f in bad.files if f.path == "model.safetensors"]
    blob = next((tmp / "store" / "blobs").glob(f"*/{weights.sha256}"))
    blob.chmod(0o644)
    blob.write_bytes(bytes(weights.size))
    yield w
    w.stop()


@pytest.fixture(scope="module")
def app(ns: Topics, kafka_bootstrap: str, tiny_model_name: str, store: LocalWeights,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    a = start_inference(tmp_path_factory.mktemp("pod"), model=tiny_model_name, bootstrap=kafka_bootstrap,
                        topic_prefix=ns.prefix, weights_endpoint=store.endpoint, heartbeat_interval_s=0.3)
    yield a
    a.stop(2)


@pytest.fixture(scope="module")
def orders(store: LocalWeights, tiny_model_name: str) -> Any:
    """An operator's order through the Weights service: it publishes the ModelUpdate, then saves its state
    (which heartbeats hand back to pods as the desired state). Promotions are forced: a rolled-back
    version is promoted again here."""
    stub, model = store.stub, tiny_model_name

    def send(action: int, version: str, *, fraction: float = 0.0) -> None:
        if action == P:
            stub.Promote(weights_pb2.PromoteRequest(model=model, version=version, force=True), timeout=60)
        elif action == C:
            stub.Canary(weights_pb2.CanaryRequest(model=model, version=version, fraction=fraction), timeout=60)
        else:
            stub.Rollback(weights_pb2.RollbackRequest(model=model, version=version, tenant=""), timeout=60)
    return send


@pytest.fixture(scope="module")
def forge(kafka_bootstrap: str, ns: Topics, tiny_model_name: str) -> Iterator[Any]:
    """An order written straight to the topic: one the Weights service would never send (signed as weights:
    the pod's own checks are under test, not the signature)."""
    producer = signed_producer(kafka_bootstrap, "weights")

    def send(action: events_pb2.UpdateAction, version: str) -> None:
        u = events_pb2.ModelUpdate(envelope=make_envelope("operator", source="test"), model=tiny_model_name,
                                   action=action, version=version)
        producer.produce(ns.model_updates, tiny_model_name, u)
        producer.flush(10)
    yield send
    producer.close()


def _beat(store: LocalWeights, app: Any) -> weights_pb2.PodStatus:
    """The pod's last heartbeat as the Weights service's Status shows it (empty before the first)."""
    return store.pod(app.model, app.settings.pod_id) or weights_pb2.PodStatus()


def _ask(c: InferenceClient, tenant: str = "globex", **kw: Any) -> Any:
    kw.setdefault("max_new_tokens", 6)
    return c.generate("same question every time", tenant=tenant, **kw)


def test_swap_under_concurrent_load_loses_no_request(app: Any, orders: Any, store: LocalWeights,
                                                     kafka_bootstrap: str, ns: Topics) -> None:
    results: list[tuple[str, str]] = []        # (interaction id, version)
    errors: list[BaseException] = []
    stop = threading.Event()
    client = InferenceClient(f"127.0.0.1:{app.port}")

    def load() -> None:
        while not stop.is_set():
            try:
                r = _ask(client)
                results.append((r.choices[0].interaction_id, r.policy_version))
            except BaseException as e:  # noqa: BLE001 - collected and asserted on below
                errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(results) >= 8, what="traffic before the swap")
    orders(P, "v1")
    wait_for(lambda: any(v == "v1" for _, v in results), what="v1 to serve")
    seen_v1 = len(results)
    wait_for(lambda: len(results) >= seen_v1 + 8, what="traffic after the swap")
    stop.set()
    for t in threads:
        t.join(timeout=30)
    client.close()
    assert not errors, errors[:3]
    versions = [v for _, v in results]
    assert set(versions) == {"base", "v1"}
    assert versions[-4:] == ["v1"] * 4
    events = collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=[i for i, _ in results])
    by_id = {e.interaction_id: e.policy_version for e in events}
    assert all(by_id[i] == v for i, v in results)                 # every answer attributed to its producer
    wait_for(lambda: _beat(store, app).serving_version == "v1", what="heartbeat v1")
    assert (REGISTRY.get_sample_value("apprentice_inference_version_loads_total", {"outcome": "loaded"}) or 0) >= 1


def test_lora_canary_and_tenant_versions(app: Any, orders: Any, store: LocalWeights, kafka_bootstrap: str,
                                         ns: Topics) -> None:
    c = InferenceClient(f"127.0.0.1:{app.port}")
    before = _ask(c)
    assert before.policy_version == "v1"
    orders(C, "l2", fraction=1.0)
    wait_for(lambda: _ask(c).policy_version == "l2", what="the l2 canary")
    canary = _ask(c)
    orders(P, "t3")                                               # acme's version: acme's slot only
    wait_for(lambda: _ask(c, tenant="acme").policy_version == "t3", what="acme's t3")
    acme = _ask(c, tenant="acme")
    other = _ask(c, tenant="globex")
    assert other.policy_version == "l2"                           # operator canary for tenants without a slot
    ids = [canary.choices[0].interaction_id, acme.choices[0].interaction_id]
    got = {e.interaction_id: e for e in collect(kafka_bootstrap, ns.interactions, events_pb2.Interaction, want=ids)}
    assert got[ids[0]].canary and got[ids[0]].policy_version == "l2"
    assert not got[ids[1]].canary and got[ids[1]].policy_version == "t3" and got[ids[1]].envelope.tenant == "acme"
    # LoRA adapters attach to the one base in memory and change its answers
    base_bb = app.engine._policies["base"].backbone
    assert app.engine._policies["l2"].backbone is base_bb and app.engine._policies["t3"].backbone is base_bb
    lp = {e.policy_version: list(e.response_logprobs_t1) for e in got.values()}
    assert lp["l2"] != pytest.approx(lp["t3"], abs=1e-3)
    wait_for(lambda: (hb := _beat(store, app)) and dict(hb.tenant_versions) == {"": "v1", "acme": "t3"}
             and dict(hb.tenant_canaries) == {"": "l2"} and hb.canary_requests > 0, what="heartbeat with tenants")
    c.close()


def test_failed_or_foreign_versions_keep_the_old_one(app: Any, orders: Any, forge: Any, store: LocalWeights) -> None:
    c = InferenceClient(f"127.0.0.1:{app.port}")
    failed_before = REGISTRY.get_sample_value("apprentice_inference_version_loads_total", {"outcome": "failed"}) or 0
    orders(R, "v1")                                               # ends the canary: v1 for everyone
    wait_for(lambda: _ask(c).policy_version == "v1", what="v1 after rollback of the canary")
    orders(P, "bad")
    wait_for(lambda: "bad" in _beat(store, app).last_error, what="last_error for bad")
    assert "sha256" in _beat(store, app).last_error
    assert _ask(c).policy_version == "v1"
    orders(R, "v1")                                               # the operator gives up on bad
    forge(P, "t4")                                                # acme's version ordered for everyone
    wait_for(lambda: "t4" in _beat(store, app).last_error, what="last_error for t4")
    assert "tenant 'acme'" in _beat(store, app).last_error
    assert _ask(c).policy_version == "v1" and _ask(c, tenant="acme").policy_version == "t3"
    assert "t4" not in app.engine.loaded_versions() and "bad" not in app.engine.loaded_versions()
    failed_after = REGISTRY.get_sample_value("apprentice_inference_version_loads_total", {"outcome": "failed"}) or 0
    assert failed_after >= failed_before + 2   # bad: sha256 mismatch at download; t4: the tenant check
    c.close()


def test_rollback_and_heartbeat_catch_up(app: Any, orders: Any, store: LocalWeights) -> None:
    c = InferenceClient(f"127.0.0.1:{app.port}")
    orders(R, "base")
    wait_for(lambda: _ask(c).policy_version == "base", what="rollback to base")
    wait_for(lambda: "v1" not in app.engine.loaded_versions(), what="v1 unloaded")
    # v1 promoted again, its order lost on the way (never on the topic): the service's state says v1, the
    # pod never heard of it, and converges from the heartbeat's desired state
    desk = store.service.desk
    publish, desk.publish = desk.publish, lambda update: None
    try:
        orders(P, "v1")
    finally:
        desk.publish = publish
    wait_for(lambda: _ask(c).policy_version == "v1", what="catch-up to v1")
    c.close()


def test_forged_and_replayed_orders_are_refused_and_dead_lettered(app: Any, orders: Any, store: LocalWeights,
                                                                  kafka_bootstrap: str, ns: Topics,
                                                                  tiny_model_name: str) -> None:
    """Attack (issue #33 item 2): a ModelUpdate written unsigned, one signed by the trainer (who may not
    write model updates), and a genuine promote of l2 replayed after a newer promote of v1 are all refused
    by the running pod: it keeps serving v1, and each refusal is on the dead-letter topic with its reason."""
    c = InferenceClient(f"127.0.0.1:{app.port}")
    orders(P, "l2")
    wait_for(lambda: _ask(c).policy_version == "l2", what="l2 promoted")
    orders(P, "v1")
    wait_for(lambda: _ask(c).policy_version == "v1", what="v1 promoted")
    genuine = [m for m in read_to_end(kafka_bootstrap, ns.model_updates)
               if (u := events_pb2.ModelUpdate.FromString(m.value())).action == P and u.version == "l2"]
    assert genuine, "the weights service's promote of l2 is on the topic"
    old = genuine[-1]

    forged = events_pb2.ModelUpdate(envelope=make_envelope("operator", source="test"), model=tiny_model_name,
                                    action=P, version="l2")
    unsigned = EventProducer(kafka_bootstrap, client_id="test-unsigned")
    trainer = signed_producer(kafka_bootstrap, "trainer")
    try:
        unsigned.produce(ns.model_updates, tiny_model_name, forged)
        unsigned.flush(10)
        trainer.produce(ns.model_updates, tiny_model_name, forged)
        trainer.flush(10)
        # the replay: the very bytes and headers the weights service wrote, signature included
        unsigned._producer.produce(ns.model_updates, old.value(), old.key(), headers=old.headers())
        unsigned.flush(10)
    finally:
        unsigned.close()
        trainer.close()

    def refused() -> list[events_pb2.DeadLetter]:
        dls = [events_pb2.DeadLetter.FromString(m.value()) for m in read_to_end(kafka_bootstrap, ns.deadletter)]
        return [d for d in dls if d.stage == "inference.hotswap"]
    dead = wait_for(lambda: (d := refused()) and len(d) >= 3 and d, what="three dead letters from the pod")
    for d in dead:
        print(f"dead letter: stage={d.stage} reason={d.reason}")
    reasons = " | ".join(d.reason for d in dead)
    assert "unsigned" in reasons and "trainer may not write" in reasons and "replay" in reasons, reasons
    assert all(d.origin_topic == ns.model_updates for d in dead)
    for _ in range(3):
        assert _ask(c).policy_version == "v1"           # still serving the current version
    c.close()
