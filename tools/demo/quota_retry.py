"""Generate as a well-behaved client does under the tenant's quota: a RESOURCE_EXHAUSTED answer (the
inference service's per-tenant quota, services/inference/quotas.py) is waited out and retried until the
call's own deadline, instead of failing the simulated user. The demo's traffic is one tenant driving the
service on purpose, so it meets its quota by design."""

from __future__ import annotations

import random
import time
from typing import Any

import grpc

from shared.proto.apprentice.v1 import inference_pb2


def generate(stub: Any, req: inference_pb2.GenerateRequest, *, timeout_s: float) -> Any:
    """`stub.Generate(req)`, retried on RESOURCE_EXHAUSTED with a jittered pause, within `timeout_s` in all."""
    deadline = time.monotonic() + timeout_s
    pause = 0.25
    while True:
        left = deadline - time.monotonic()
        try:
            return stub.Generate(req, timeout=max(left, 0.1))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or left <= pause:
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 2.0)
