"""Hot swap end to end: ModelUpdate orders on the real broker, versions fetched over real gRPC from a
minimal Weights server (files written by `save_version_files`), loaded by the tiny model's engine.

A swap under concurrent load loses no request and attributes each answer to the version that produced
it; LoRA versions attach to the loaded base; canaries and tenant versions route as ordered; a version
that fails to download/verify, or that belongs to another tenant, keeps the old version and is reported
in the heartbeat; rollback; a pod that missed orders converges on the heartbeat's desired state.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY

from services.inference.client import InferenceClient
from shared.events import make_envelope
from shared.kafka.admin import delete_topics, ensure_topics
from shared.kafka.producer import EventProducer
from shared.proto.apprentice.v1 import events_pb2
from shared.topics import Topics
from tests.helpers.inference import FileWeightsServer, start_inference
from tests.helpers.kafka import collect

pytestmark = pytest.mark.integration
P, C, R = events_pb2.UPDATE_ACTION_PROMOTE, events_pb2.UPDATE_ACTION_CANARY, events_pb2.UPDATE_ACTION_ROLLBACK


def _full(tmp: Path, name: str, model_name: str, scale: float) -> Path:
    from shared.models import load_model
    from shared.weights_client import save_version_files

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
    from shared.weights_client import save_version_files

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
def store(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> Iterator[FileWeightsServer]:
    tmp = tmp_path_factory.mktemp("store")
    fws = FileWeightsServer()
    m = tiny_model_name
    fws.add(m, "v1", _full(tmp, "v1", m, 0.3), kind="full")
    fws.add(m, "l2", _lora(tmp, "l2", m, 2), kind="lora", base_version="base")
    fws.add(m, "t3", _lora(tmp, "t3", m, 3), kind="lora", base_version="base", tenant="acme")
    fws.add(m, "t4", _lora(tmp, "t4", m, 4), kind="lora", base_version="base", tenant="acme")
    bad = _full(tmp, "bad", m, 0.1)
    fws.add(m, "bad", bad, kind="full")
    (bad / "model.safetensors").write_bytes(b"not the bytes the manifest promised")
    yield fws
    fws.stop()


@pytest.fixture(scope="module")
def app(ns: Topics, kafka_bootstrap: str, tiny_model_name: str, store: FileWeightsServer,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    a = start_inference(tmp_path_factory.mktemp("pod"), model=tiny_model_name, bootstrap=kafka_bootstrap,
                        topic_prefix=ns.prefix, weights_endpoint=store.endpoint, heartbeat_interval_s=0.3)
    yield a
    a.stop(2)


@pytest.fixture(scope="module")
def orders(kafka_bootstrap: str, ns: Topics, tiny_model_name: str) -> Iterator[Any]:
    producer = EventProducer(kafka_bootstrap)

    def send(action: int, version: str = "", *, tenant: str = "", fraction: float = 0.0) -> None:
        u = events_pb2.ModelUpdate(envelope=make_envelope(tenant or "operator", source="test"), model=tiny_model_name,
                                   action=action, version=version, tenant=tenant, canary_fraction=fraction)
        producer.produce(ns.model_updates, tiny_model_name, u)
        producer.flush(10)
    yield send
    producer.close()


def _wait(cond: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _ask(c: InferenceClient, tenant: str = "globex", **kw: Any) -> Any:
    kw.setdefault("max_new_tokens", 6)
    return c.generate("same question every time", tenant=tenant, **kw)


def test_swap_under_concurrent_load_loses_no_request(app: Any, orders: Any, store: FileWeightsServer,
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
    _wait(lambda: len(results) >= 8, what="traffic before the swap")
    orders(P, "v1")
    _wait(lambda: any(v == "v1" for _, v in results), what="v1 to serve")
    seen_v1 = len(results)
    _wait(lambda: len(results) >= seen_v1 + 8, what="traffic after the swap")
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
    _wait(lambda: (hb := store.last_heartbeat()) is not None and hb.serving_version == "v1", what="heartbeat v1")
    assert REGISTRY.get_sample_value("apprentice_inference_version_loads_total", {"outcome": "loaded"}) >= 1


def test_lora_canary_and_tenant_versions(app: Any, orders: Any, store: FileWeightsServer, kafka_bootstrap: str,
                                         ns: Topics) -> None:
    c = InferenceClient(f"127.0.0.1:{app.port}")
    before = _ask(c)
    assert before.policy_version == "v1"
    orders(C, "l2", fraction=1.0)
    _wait(lambda: _ask(c).policy_version == "l2", what="the l2 canary")
    canary = _ask(c)
    orders(P, "t3", tenant="acme")
    _wait(lambda: _ask(c, tenant="acme").policy_version == "t3", what="acme's t3")
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
    _wait(lambda: (hb := store.last_heartbeat()) is not None and dict(hb.tenant_versions) == {"": "v1", "acme": "t3"}
          and dict(hb.tenant_canaries) == {"": "l2"} and hb.canary_requests > 0, what="heartbeat with tenants")
    c.close()


def test_failed_or_foreign_versions_keep_the_old_one(app: Any, orders: Any, store: FileWeightsServer) -> None:
    c = InferenceClient(f"127.0.0.1:{app.port}")
    failed_before = REGISTRY.get_sample_value("apprentice_inference_version_loads_total", {"outcome": "failed"}) or 0
    orders(R, "v1")                                               # ends the canary: v1 for everyone
    _wait(lambda: _ask(c).policy_version == "v1", what="v1 after rollback of the canary")
    orders(P, "bad")
    _wait(lambda: "bad" in ((hb := store.last_heartbeat()) and hb.last_error or ""), what="last_error for bad")
    assert "sha256" in store.last_heartbeat().last_error
    assert _ask(c).policy_version == "v1"
    orders(P, "t4")                                               # acme's version ordered for everyone
    _wait(lambda: "t4" in (store.last_heartbeat().last_error or ""), what="last_error for t4")
    assert "tenant 'acme'" in store.last_heartbeat().last_error
    assert _ask(c).policy_version == "v1" and _ask(c, tenant="acme").policy_version == "t3"
    assert "t4" not in app.engine.loaded_versions() and "bad" not in app.engine.loaded_versions()
    failed_after = REGISTRY.get_sample_value("apprentice_inference_version_loads_total", {"outcome": "failed"}) or 0
    assert failed_after >= failed_before + 2   # bad: sha256 mismatch at download; t4: the tenant check
    c.close()


def test_rollback_and_heartbeat_catch_up(app: Any, orders: Any, store: FileWeightsServer) -> None:
    c = InferenceClient(f"127.0.0.1:{app.port}")
    orders(R, "base")
    _wait(lambda: _ask(c).policy_version == "base", what="rollback to base")
    _wait(lambda: "v1" not in app.engine.loaded_versions(), what="v1 unloaded")
    # the weights service says this pod should serve v1 (an order the pod never saw): it converges
    store.desired = [events_pb2.ModelUpdate(model=app.model, action=P, version="v1")]
    try:
        _wait(lambda: _ask(c).policy_version == "v1", what="catch-up to v1")
    finally:
        store.desired = []
    c.close()
