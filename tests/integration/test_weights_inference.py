"""The weights service driving a real inference pod (services/inference, tiny model) over the real broker:
promote, canary, rollback and a LoRA version reach the pod through model-updates, the pod downloads
each version from the weights service, serves it (policy_version on its answers), and Status converges
from the pod's own heartbeats.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.weights.service import RunningServer, start
from services.weights.settings import LocalStoreSettings, WeightsSettings
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.weights.client import save_version_files, upload_version
from tests.helpers.waiting import wait_for
from tests.integration.weights_evalsets import small_eval_sets

pytestmark = pytest.mark.integration
MODEL = "tiny-random"


@pytest.fixture
def weights(topics: Topics, tmp_path: Path) -> Iterator[RunningServer]:
    settings = WeightsSettings(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=tmp_path / "store"),
                               policy="manual", eval_max_new_tokens=8, order_deadline_s=30,
                               **small_eval_sets(tmp_path / "sets"))  # type: ignore[arg-type]
    running = start(settings, consume=False)
    yield running
    running.stop(grace=1.0)


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory, tiny_model_name: str) -> dict[str, Path]:
    import torch
    from peft import LoraConfig, get_peft_model

    from shared.models import load_model

    tmp = tmp_path_factory.mktemp("versions")
    out = {}
    for name, scale in (("full-a", 1e-3), ("full-b", 2e-3)):
        model, _ = load_model(tiny_model_name)
        torch.manual_seed(int(scale * 1e4))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * scale)
        save_version_files(model, tmp / name, "full")
        out[name] = tmp / name
    base, _ = load_model(tiny_model_name)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    save_version_files(peft, tmp / "lora", "lora")
    out["lora"] = tmp / "lora"
    return out


def test_orders_drive_a_real_inference_pod(weights: RunningServer, topics: Topics, kafka_bootstrap: str,
                                           versions: dict[str, Path], tmp_path: Path) -> None:
    from services.inference.client import InferenceClient
    from tests.helpers.inference import start_inference

    stub = weights_pb2_grpc.WeightsStub(grpc.insecure_channel(f"127.0.0.1:{weights.port}"))
    v1 = upload_version(stub, weights_pb2.UploadHeader(model=MODEL, kind="full"), versions["full-a"])
    v2 = upload_version(stub, weights_pb2.UploadHeader(model=MODEL, kind="full"), versions["full-b"])
    v3 = upload_version(stub, weights_pb2.UploadHeader(model=MODEL, kind="lora", base_version="base"),
                        versions["lora"])
    # Gate the candidates before the pod starts: transformers' from_pretrained is not thread-safe and the
    # pod and this weights server share one process here (in production they are separate processes).
    assert weights.service.evaluator is not None
    for m in (v1, v2, v3):
        assert weights.service.evaluator.evaluate(m).status == weights_pb2.VERSION_STATUS_APPROVED

    app = start_inference(tmp_path / "pod", bootstrap=kafka_bootstrap, topic_prefix=topics.prefix,
                          weights_endpoint=f"127.0.0.1:{weights.port}")
    client = InferenceClient(f"127.0.0.1:{app.port}", timeout=60)
    status = lambda: stub.Status(weights_pb2.StatusRequest(model=MODEL))  # noqa: E731

    def served() -> str:
        return client.generate("hello", max_new_tokens=2).policy_version

    try:
        wait_for(lambda: status().converged, what="the pod's first heartbeat")
        assert status().pods[0].pod_id == app.settings.pod_id and served() == "base"

        stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v1", reason="test"))
        wait_for(lambda: status().converged and status().promoted_version == "v1", what="pod on v1")
        assert served() == "v1"

        stub.Canary(weights_pb2.CanaryRequest(model=MODEL, version="v2", fraction=1.0))
        wait_for(lambda: status().converged and status().canary_version == "v2", what="pod canaries v2")
        assert served() == "v2"  # fraction 1.0: every request goes to the canary
        assert status().pods[0].canary_requests >= 1 or wait_for(
            lambda: status().pods[0].canary_requests >= 1, what="canary requests reported")

        stub.Rollback(weights_pb2.RollbackRequest(model=MODEL, reason="canary looked worse"))
        wait_for(lambda: status().converged and not status().canary_version, what="canary aborted")
        assert served() == "v1"
        assert stub.Get(weights_pb2.GetVersionRequest(model=MODEL, version="v2")).status == \
            weights_pb2.VERSION_STATUS_ROLLED_BACK

        stub.Promote(weights_pb2.PromoteRequest(model=MODEL, version="v3"))  # the LoRA adapter on the base
        wait_for(lambda: status().converged and status().promoted_version == "v3", what="pod on LoRA v3")
        assert served() == "v3"
        stub.Rollback(weights_pb2.RollbackRequest(model=MODEL))
        wait_for(lambda: status().converged and status().promoted_version == "v1", what="rolled back to v1")
        assert served() == "v1"
        pod = status().pods[0]
        assert pod.converged and not pod.lagging and not pod.last_error
    finally:
        client.close()
        app.stop(grace=1.0)
