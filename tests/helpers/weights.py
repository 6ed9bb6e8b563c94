"""The real Weights service for tests: started in-process on loopback port 0, versions uploaded with the
real client (`shared.weights.client.upload_version`), pods' heartbeats read back through `Status`.

Where a test needs a weights service (an inference pod downloading versions, heartbeats, the desired
state a pod catches up on), it runs this one, never a stand-in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc


def start_weights(store_dir: Path, **overrides: Any) -> Any:
    """The real Weights server on loopback port 0 (checkpoint consumer off, manual promotion), secured by
    the environment; returns the started `RunningServer` (`.port`, `.service`, `.stop()`)."""
    from services.weights.service import start
    from services.weights.settings import LocalStoreSettings, WeightsSettings

    kw: dict[str, Any] = dict(port=0, host="127.0.0.1", metrics_port=0, store=LocalStoreSettings(dir=store_dir), policy="manual",
                              grace_s=1.0)
    kw.update(overrides)
    return start(WeightsSettings(**kw), consume=False)


class LocalWeights:
    """A started Weights service plus an insecure channel to it (tests that run without TLS)."""

    def __init__(self, store_dir: Path, **overrides: Any) -> None:
        self.running = start_weights(store_dir, **overrides)
        self.channel = grpc.insecure_channel(self.endpoint)
        self.stub = weights_pb2_grpc.WeightsStub(self.channel)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    @property
    def service(self) -> Any:
        """The `WeightsService` behind the server (its store, order desk, evaluator)."""
        return self.running.service

    def upload(self, model: str, src: Path, *, kind: str, version: str = "", base_version: str = "",
               tenant: str = "") -> weights_pb2.Manifest:
        """Upload the version folder `src` (written by `save_version_files`) with the real client."""
        from shared.weights.client import upload_version

        header = weights_pb2.UploadHeader(model=model, version=version, kind=kind, base_version=base_version,
                                          tenant=tenant)
        return upload_version(self.stub, header, src, timeout=120)

    def approve(self, model: str, version: str) -> weights_pb2.Manifest:
        """Record an approving verdict without running the eval gate: for tests of what happens after the
        gate (orders, downloads, swaps), not of the gate itself."""
        def approved(m: weights_pb2.Manifest) -> None:
            m.status = weights_pb2.VERSION_STATUS_APPROVED
            m.status_reason = "approved by the test"

        return self.service.store.update(model, version, approved)

    def pod(self, model: str, pod_id: str) -> weights_pb2.PodStatus | None:
        """The pod's last heartbeat as `Status` reports it, or None before its first one."""
        status = self.stub.Status(weights_pb2.StatusRequest(model=model), timeout=10)
        return next((p for p in status.pods if p.pod_id == pod_id), None)

    def stop(self) -> None:
        self.channel.close()
        self.running.stop(grace=1.0)
