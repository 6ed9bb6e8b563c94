"""The simulated backend's late KPI reports: the chosen share is held back and sent after the round's
traffic, each no earlier than it is due; the others are sent with the answer. The Feedback client here
records the requests (the wire is covered by the demo's end-to-end test)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import grpc

from shared.proto.apprentice.v1 import inference_pb2_grpc
from tools.demo.simulated_users import SimulatedUsers
from tools.tasks.task import load_task


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[float, Any]] = []

    def Submit(self, request: Any, timeout: float) -> None:  # noqa: N802 - the gRPC stub's method name
        self.calls.append((time.monotonic(), request))


def test_late_kpi_reports_arrive_after_the_traffic_and_not_before_they_are_due() -> None:
    task = load_task("support_routing")
    users = SimulatedUsers(task, "127.0.0.1:1", seed=3, late_fraction=0.5, late_s=(0.2, 0.4))
    rec = _Recorder()
    users.feedback = cast(inference_pb2_grpc.FeedbackStub, rec)   # in the stub's place: records each Submit
    try:
        fact = task.facts[0]
        t0 = time.monotonic()
        for i in range(40):
            users._report_or_hold(f"i{i}", fact, True)
        on_time = len(rec.calls)
        users._report_late()
        kpis = [r for _, r in rec.calls if r.kind == "kpi"]
        assert len(kpis) == 40 and {r.interaction_id for r in kpis} == {f"i{i}" for i in range(40)}
        assert 5 < users.late_reported < 35 and on_time == 40 - users.late_reported
        assert all(at >= t0 + 0.2 for at, _ in rec.calls[on_time:])          # none before it was due
    finally:
        users.close()


class _Saturated(inference_pb2_grpc.InferenceServicer):
    """An inference service whose tenant quota is always full (every call is RESOURCE_EXHAUSTED)."""

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - the gRPC method name
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "tenant quota: 16 samples in flight")


def test_a_user_whose_call_outlives_its_deadline_gives_up_and_the_round_goes_on() -> None:
    server = grpc.server(ThreadPoolExecutor(4))
    inference_pb2_grpc.add_InferenceServicer_to_server(_Saturated(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    task = load_task("support_routing")
    users = SimulatedUsers(task, f"127.0.0.1:{port}", seed=1, timeout_s=0.6, concurrency=3)
    try:
        exchanges = users.run(users.pick(3), max_new_tokens=8, temperature=0.7, n=2)
        assert exchanges == [] and users.abandoned == 3
    finally:
        users.close()
        server.stop(None)
