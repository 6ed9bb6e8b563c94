"""Weights with the real broker: orders reach a real consumer of model-updates, pods report by heartbeat
and Status converges (or flags the pod that did not follow); CheckpointPublished runs the eval gate and
the promotion policy; poison records are dead-lettered; retention keeps what it must; the CLI works.

The pod here is a small real client (Kafka consumer + Download + load on the tiny model + Heartbeat);
tests/integration/test_weights_inference.py runs the same flow against the inference service itself.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from services.weights.service import RunningServer, start
from services.weights.settings import LocalStoreSettings, WeightsSettings
from shared.contracts.events import decode, make_envelope
from shared.contracts.topics import Topics
from shared.kafka import EventConsumer
from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc
from shared.weights.client import save_version_files, upload_version
from shared.weights.download import download_version
from tests.helpers.kafka import read_all
from tests.helpers.signing import signed_producer
from tests.helpers.waiting import wait_for
from tests.integration.weights_evalsets import small_eval_sets

pytestmark = pytest.mark.integration
MODEL = "tiny-random"
A = events_pb2
T = TypeVar("T")


class MiniPod:
    """A real pod client: follows model-updates on Kafka, downloads + loads each ordered version, heartbeats.
    `follow=False` makes a pod that heartbeats but ignores orders (the stale pod Status must flag)."""

    def __init__(self, pod_id: str, endpoint: str, bootstrap: str, topic: str, workdir: Path, *,
                 follow: bool = True) -> None:
        self.pod_id, self.follow, self.workdir = pod_id, follow, workdir
        self.channel = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = weights_pb2_grpc.WeightsStub(self.channel)
        self.consumer = EventConsumer(bootstrap, f"pod-{pod_id}-{uuid.uuid4().hex[:6]}", [topic])
        self.serving, self.canary, self.fraction = "base", "", 0.0
        self.canary_requests = 0
        self.orders: list[events_pb2.ModelUpdate] = []
        self.loaded: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _load(self, version: str) -> None:
        if version == "base" or version in self.loaded:
            return
        from safetensors.torch import load_file

        dest = self.workdir / self.pod_id / version
        download_version(self.stub, MODEL, version, dest)  # sha256-verified, atomic
        # The bytes really are the model's tensors. (Not from_pretrained: transformers 5 loads are not
        # thread-safe, and the weights server evaluates in this same process.)
        assert "model.embed_tokens.weight" in load_file(dest / "model.safetensors")
        self.loaded.append(version)

    def _apply(self, u: events_pb2.ModelUpdate) -> None:
        self.orders.append(u)
        self._load(u.version)
        if u.action == A.UPDATE_ACTION_CANARY:
            self.canary, self.fraction, self.canary_requests = u.version, u.canary_fraction, 0
        else:
            self.serving = u.version
            if u.action == A.UPDATE_ACTION_ROLLBACK or self.canary == u.version:
                self.canary, self.fraction = "", 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self.consumer.poll_batch(timeout=0.2):
                if self.follow:
                    self._apply(decode(events_pb2.ModelUpdate, msg.value()))
            if self.canary:
                self.canary_requests += 1  # one healthy canary request per beat
            hb = weights_pb2.PodHeartbeat(
                pod_id=self.pod_id, model=MODEL, serving_version=self.serving, canary_version=self.canary,
                canary_fraction=self.fraction, tenant_versions={"": self.serving},
                tenant_canaries={"": self.canary} if self.canary else {}, canary_requests=self.canary_requests)
            with contextlib.suppress(grpc.RpcError):  # a missed beat is what Status must tolerate
                self.stub.Heartbeat(hb, timeout=5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()
        self.channel.close()


def settings_for(tmp_path: Path, **kw: object) -> WeightsSettings:
    kw.setdefault("policy", "manual")
    kw.update(small_eval_sets(tmp_path / "sets"))
    return WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"),
                           consumer_group=f"weights-{uuid.uuid4().hex[:6]}", eval_max_new_tokens=8,
                           order_deadline_s=2.0, heartbeat_timeout_s=5.0, **kw)  # type: ignore[arg-type]


@pytest.fixture
def make_server(topics: Topics, tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    servers: list[RunningServer] = []

    def make(**kw: object) -> RunningServer:
        servers.append(start(settings_for(tmp_path, **kw), consume=bool(kw.pop("consume", True))))
        return servers[-1]

    yield make
    for s in servers:
        s.stop(grace=1.0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> dict[str, Path]:
    """Real tiny checkpoints: the base weights (good), lightly perturbed (good), one NaN tensor (bad)."""
    import torch

    from shared.models import load_model

    tmp = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name in ("same", "perturbed", "nan"):
        model, _ = load_model(tiny_model_name)
        with torch.no_grad():
            if name == "perturbed":
                torch.manual_seed(2)
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            if name == "nan":
                model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
        save_version_files(model, tmp / name, "full")
        out[name] = tmp / name
    return out


def stub_for(server: RunningServer) -> weights_pb2_grpc.WeightsStub:
    return weights_pb2_grpc.WeightsStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))


def header(**kw: object) -> weights_pb2.UploadHeader:
    return weights_pb2.UploadHeader(model=MODEL, kind="full", **kw)  # type: ignore[arg-type]


def test_orders_reach_pods_and_status_converges(make_server: Callable[..., RunningServer], topics: Topics,
                                                kafka_bootstrap: str, checkpoints: dict[str, Path],
                                                tmp_path: Path) -> None:
    server = make_server(consume=False)
    stub = stub_for(server)
    for name in ("same", "perturbed", "same"):
        upload_version(stub, header(), checkpoints[name])
    endpoint = f"127.0.0.1:{server.port}"
    pods = [MiniPod(f"pod-{i}", endpoint, kafka_bootstrap, topics.model_updates, tmp_path) for i in range(2)]
    try:
        status = lambda: stub.Status(weights_pb2.StatusRequest(model=MODEL))  # noqa: E731
        wait_for(lambda: len(status().pods) == 2 and status().converged, what="pods on base")
        # promote runs the eval gate first (v1 is a CANDIDATE)
        ack = stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v1", reason="first"), timeout=120)
        assert stub.Get(weights_pb2.GetVersionRequest(model=MODEL, version="v1")).status == \
            weights_pb2.VERSION_STATUS_PROMOTED
        wait_for(lambda: status().converged and status().promoted_version == "v1", what="convergence on v1")
        assert all(p.orders[-1].envelope.event_id == ack.order_id for p in pods)
        stub.Canary(weights_pb2.CanaryRequest(model=MODEL, version="v2", fraction=0.25), timeout=120)
        wait_for(lambda: status().converged and status().canary_version == "v2", what="canary v2 everywhere")
        wait_for(lambda: status().canary_healthy_requests >= 2, what="healthy canary requests counted")
        stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v2"), timeout=120)
        wait_for(lambda: status().converged and status().promoted_version == "v2", what="convergence on v2")
        ack = stub.Rollback(weights_pb2.RollbackRequest(model=MODEL, reason="answers got worse"))
        assert ack.version == "v1" and ack.action == "rollback"
        wait_for(lambda: status().converged and status().promoted_version == "v1", what="rollback to v1")
        actions = [(u.action, u.version) for u in pods[0].orders]
        assert actions == [(A.UPDATE_ACTION_PROMOTE, "v1"), (A.UPDATE_ACTION_CANARY, "v2"),
                           (A.UPDATE_ACTION_PROMOTE, "v2"), (A.UPDATE_ACTION_ROLLBACK, "v1")]
        # the records on the real topic: keyed by model name, tenant carried
        records = read_all(kafka_bootstrap, topics.model_updates, expect=4)
        assert {r.key() for r in records} == {MODEL.encode()}
        assert [decode(events_pb2.ModelUpdate, r.value()).tenant for r in records] == ["", "", "", ""]

        # a pod that stops following orders is flagged after the deadline; the others converge
        stale = MiniPod("stale", endpoint, kafka_bootstrap, topics.model_updates, tmp_path, follow=False)
        pods.append(stale)
        stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v3", force=True), timeout=120)
        st = wait_for(lambda: (s := status()).lagging_pods == 1 and s, stall_s=20, what="stale pod flagged")
        by_pod = {p.pod_id: p for p in st.pods}
        assert by_pod["stale"].lagging and not by_pod["stale"].converged
        assert "serves 'base', ordered 'v3'" in by_pod["stale"].detail
        assert by_pod["pod-0"].converged and by_pod["pod-1"].converged and not st.converged
    finally:
        for p in pods:
            p.close()


def _publish_checkpoint(bootstrap: str, topic: str, m: weights_pb2.Manifest, **metrics: float) -> str:
    ev = events_pb2.CheckpointPublished(envelope=make_envelope("default", source="test-trainer"), model=m.model,
                                        version=m.version, kind=m.kind, base_model=m.base_model, tenant=m.tenant)
    ev.metrics.update(metrics)
    p = signed_producer(bootstrap, "trainer")
    p.produce(topic, m.model, ev)
    p.flush()
    return ev.envelope.event_id


def test_checkpoint_events_run_the_gate_and_the_policy(make_server: Callable[..., RunningServer], topics: Topics,
                                                       kafka_bootstrap: str, checkpoints: dict[str, Path]) -> None:
    server = make_server(policy="auto")
    stub = stub_for(server)
    get = lambda v: stub.Get(weights_pb2.GetVersionRequest(model=MODEL, version=v))  # noqa: E731
    good = upload_version(stub, header(tenant="default", train_metrics={"hacking_flag_fraction": 0.01}),
                          checkpoints["perturbed"])
    _publish_checkpoint(kafka_bootstrap, topics.checkpoints, good)
    orders = read_all(kafka_bootstrap, topics.model_updates, expect=1, timeout=90)
    u = decode(events_pb2.ModelUpdate, orders[0].value())
    assert (u.action, u.version, u.tenant, u.previous_version) == (A.UPDATE_ACTION_PROMOTE, "v1", "default", "base")
    # the order is published first (nothing changes if Kafka refuses it), the manifest's status right after
    m = wait_for(lambda: (v := get("v1")).status == weights_pb2.VERSION_STATUS_PROMOTED and v, what="v1 promoted")
    assert {f"{r.suite}/{r.metric}" for r in m.eval_results} >= {"integrity/nonfinite_tensors", "heldout/rule_score",
                                                                  "ood/ref_loglik", "ood/repetition"}
    assert all(r.passed for r in m.eval_results)

    bad = upload_version(stub, header(tenant="default"), checkpoints["nan"])
    _publish_checkpoint(kafka_bootstrap, topics.checkpoints, bad)
    hacked = upload_version(stub, header(tenant="default"), checkpoints["same"])
    _publish_checkpoint(kafka_bootstrap, topics.checkpoints, hacked, hacking_flag_fraction=0.6)
    wait_for(lambda: get("v3").status == weights_pb2.VERSION_STATUS_REJECTED, stall_s=90, what="v3 rejected")
    assert get("v2").status == weights_pb2.VERSION_STATUS_REJECTED and "NaN/Inf" in get("v2").status_reason
    assert "hacking_flag_fraction" in get("v3").status_reason
    assert len(read_all(kafka_bootstrap, topics.model_updates, timeout=3)) == 1  # no order for rejected ones
    with pytest.raises(grpc.RpcError) as e:
        stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v2"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "rejected by the eval gate" in e.value.details()

    # poison records go to the dead-letter topic and the stream goes on
    p = signed_producer(kafka_bootstrap, "trainer")
    p.produce(topics.checkpoints, MODEL, b"\x00not a protobuf")
    p.flush()
    _publish_checkpoint(kafka_bootstrap, topics.checkpoints, weights_pb2.Manifest(model=MODEL, version="v99"))
    dead = [decode(events_pb2.DeadLetter, r.value()) for r in read_all(kafka_bootstrap, topics.deadletter, expect=2)]
    assert [d.stage for d in dead] == ["weights.decode", "weights.checkpoint"]
    assert "no version 'v99'" in dead[1].reason


def test_canary_policy_promotes_after_healthy_requests(make_server: Callable[..., RunningServer], topics: Topics,
                                                       kafka_bootstrap: str, checkpoints: dict[str, Path],
                                                       tmp_path: Path) -> None:
    server = make_server(policy="canary", canary_fraction=0.2, canary_min_requests=6)
    stub = stub_for(server)
    pod = MiniPod("p", f"127.0.0.1:{server.port}", kafka_bootstrap, topics.model_updates, tmp_path)
    try:
        m = upload_version(stub, header(), checkpoints["perturbed"])
        _publish_checkpoint(kafka_bootstrap, topics.checkpoints, m)
        wait_for(lambda: len(pod.orders) >= 2, stall_s=90, what="canary then promote")
        assert [(u.action, u.version) for u in pod.orders[:2]] == [(A.UPDATE_ACTION_CANARY, "v1"),
                                                                    (A.UPDATE_ACTION_PROMOTE, "v1")]
        assert pod.orders[0].canary_fraction == pytest.approx(0.2)
        assert "canary healthy after" in pod.orders[1].reason
    finally:
        pod.close()


def test_retention_keeps_promoted_and_pinned(make_server: Callable[..., RunningServer],
                                            checkpoints: dict[str, Path]) -> None:
    server = make_server(consume=False, keep_last=2)
    stub = stub_for(server)
    upload_version(stub, header(), checkpoints["same"])
    stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v1", force=True))
    upload_version(stub, header(), checkpoints["perturbed"])
    stub.Pin(weights_pb2.PinRequest(model=MODEL, version="v2", pinned=True))
    upload_version(stub, header(), checkpoints["nan"])        # v3: collected
    upload_version(stub, header(), checkpoints["perturbed"])  # v4: the same bytes as v2 (one blob)
    upload_version(stub, header(), checkpoints["same"])       # v5
    names = lambda: [v.version for v in stub.List(weights_pb2.ListVersionsRequest(model=MODEL)).versions]  # noqa: E731
    wait_for(lambda: names() == ["v1", "v2", "v4", "v5"], stall_s=10, what="GC after upload")
    blobs = set(server.service.store.blobs.list())
    for v in names():
        assert all(f.sha256 in blobs for f in stub.Get(weights_pb2.GetVersionRequest(model=MODEL, version=v)).files)
    v1 = server.service.store.manifests.load(MODEL, "v1")
    assert v1 is not None
    nan_blob = next(f.sha256 for f in v1.files if f.path == "model.safetensors")
    assert nan_blob in blobs  # still referenced by v1/v5


def test_cli_against_the_server(make_server: Callable[..., RunningServer], checkpoints: dict[str, Path],
                                capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from services.weights.cli import main

    server = make_server(consume=False)
    monkeypatch.setenv("APPRENTICE_WEIGHTS_ENDPOINT", f"127.0.0.1:{server.port}")
    stub = stub_for(server)
    for name in ("same", "perturbed"):
        upload_version(stub, header(), checkpoints[name])
    assert main(["list", "--model", MODEL]) == 0
    out = capsys.readouterr().out
    assert "v1" in out and "candidate" in out
    assert main(["--model", MODEL, "promote", "v1"]) == 0  # runs the eval gate
    assert "promote tiny-random v1" in capsys.readouterr().out
    assert main(["--model", MODEL, "promote", "v2", "--force", "--reason", "try"]) == 0
    assert main(["--model", MODEL, "rollback"]) == 0
    assert "rollback tiny-random v1" in capsys.readouterr().out
    assert main(["--model", MODEL, "status"]) == 0
    assert "promoted *=v1" in capsys.readouterr().out
    assert stub.Get(weights_pb2.GetVersionRequest(model=MODEL)).version == "v1"  # "" = what is promoted
    assert main(["--model", MODEL, "promote", "v9"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert main(["--model", MODEL, "--endpoint", "127.0.0.1:1", "--timeout", "2", "list"]) == 3
