"""The services' gRPC APIs, metrics endpoints and the broker's group offsets, as the dashboard calls them.

Reads (versions, pod status, knowledge, health) use this process's own key; operator actions use the key
of the person signed in to the dashboard when keys are configured, so the weights and knowledge services
audit the person, not the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.dashboard.reader import GROUP_PREFIX
from services.dashboard.settings import DashboardSettings
from shared.contracts.default_ports import GRPC_PORTS, METRICS_PORTS
from shared.contracts.grader_waiting import describe, from_metrics
from shared.contracts.metric_names import INFERENCE_SPOOL_DEPTH
from shared.contracts.stack_endpoints import read_endpoints
from shared.kafka.lag import partition_lag as read_lag
from shared.metrics import metric_sum, scrape
from shared.proto.apprentice.v1 import (
    events_pb2,
    knowledge_pb2,
    knowledge_pb2_grpc,
    weights_pb2,
    weights_pb2_grpc,
)
from shared.security.channels import open_channel
from shared.security.keys import read_secret
from shared.settings import CommonSettings

DEFAULT_GRPC = {name: f"127.0.0.1:{port}" for name, port in GRPC_PORTS.items()}
DEFAULT_METRICS = METRICS_PORTS
GRPC_SERVICES = ("inference", "extractor", "weights")


@dataclass(frozen=True)
class Targets:
    grpc: dict[str, str]
    metrics: dict[str, str] = field(default_factory=dict)       # service -> host:port of /metrics

    @classmethod
    def resolve(cls, s: DashboardSettings) -> Targets:
        """Explicit settings first, then the running stack's record under APPRENTICE_HOME, then defaults."""
        rec = read_endpoints(s.common.home)
        grpc_t = {**DEFAULT_GRPC, **(rec.grpc if rec else {})}
        for name, value in (("weights", s.weights_endpoint), ("extractor", s.extractor_endpoint),
                            ("inference", s.inference_endpoint)):
            if value:
                grpc_t[name] = value
        ports = {**DEFAULT_METRICS, **(rec.metrics if rec else {})}
        metrics = {name: f"127.0.0.1:{port}" for name, port in ports.items()} | s.metrics_ports
        return cls(grpc=grpc_t, metrics=metrics)


class Backends:
    def __init__(self, settings: DashboardSettings, targets: Targets) -> None:
        self.s, self.targets = settings, targets
        self.model = settings.common.model
        self.timeout = settings.probe_timeout_s

    def _channel(self, service: str, token: str | None = None) -> grpc.Channel:
        """A channel to `service` with `token`, else the dashboard's own reading key (re-read on every
        call, so a rotated file is picked up), else this process's key."""
        if token is None and self.s.operator_token_file is not None:
            token = read_secret("", self.s.operator_token_file) or None
        return open_channel(self.targets.grpc[service], self.s.common, token=token)

    # --- weights -----------------------------------------------------------------------------------
    def versions(self) -> tuple[list[weights_pb2.Manifest], weights_pb2.StatusResponse]:
        with self._channel("weights") as ch:
            stub = weights_pb2_grpc.WeightsStub(ch)
            listed = stub.List(weights_pb2.ListVersionsRequest(model=self.model), timeout=self.timeout)
            status = stub.Status(weights_pb2.StatusRequest(model=self.model), timeout=self.timeout)
        return list(listed.versions), status

    def weights_order(self, action: str, version: str, *, fraction: float = 0.0, reason: str = "",
                      token: str | None = None) -> weights_pb2.OrderAck:
        """promote / canary / rollback `version`, as the caller behind `token` (None: this process's key)."""
        with self._channel("weights", token) as ch:
            stub = weights_pb2_grpc.WeightsStub(ch)
            if action == "promote":
                return stub.Promote(weights_pb2.PromoteRequest(model=self.model, version=version, reason=reason),
                                    timeout=30)
            if action == "canary":
                return stub.Canary(weights_pb2.CanaryRequest(model=self.model, version=version, fraction=fraction,
                                                             reason=reason), timeout=30)
            if action == "rollback":
                return stub.Rollback(weights_pb2.RollbackRequest(model=self.model, version=version, reason=reason),
                                     timeout=30)
        raise ValueError(f"unknown action {action!r}: promote, canary or rollback")

    # --- knowledge ---------------------------------------------------------------------------------
    def knowledge(self) -> list[events_pb2.KnowledgeSnapshot]:
        with self._channel("extractor") as ch:
            stub = knowledge_pb2_grpc.KnowledgeStub(ch)
            bases = stub.List(knowledge_pb2.ListKnowledgeRequest(), timeout=self.timeout).bases
            return [stub.Get(knowledge_pb2.GetKnowledgeRequest(key=b.key), timeout=self.timeout) for b in bases]

    def knowledge_action(self, action: str, key: str, item_id: str, *, text: str = "", operator: str = "",
                         token: str | None = None) -> events_pb2.KnowledgeSnapshot:
        """approve / reject / edit / restore / retire an item, or split the merged `text` off it, as the
        caller behind `token`."""
        with self._channel("extractor", token) as ch:
            stub = knowledge_pb2_grpc.KnowledgeStub(ch)
            req = knowledge_pb2.ItemActionRequest(key=key, item_id=item_id, operator=operator)
            if action == "approve":
                return stub.Approve(req, timeout=30)
            if action == "reject":
                return stub.Reject(req, timeout=30)
            if action == "restore":
                return stub.Restore(req, timeout=30)
            if action == "retire":
                return stub.Retire(req, timeout=30)
            if action in ("edit", "split"):
                edit = knowledge_pb2.EditItemRequest(key=key, item_id=item_id, text=text, operator=operator)
                return (stub.Edit if action == "edit" else stub.Split)(edit, timeout=30)
        raise ValueError(f"unknown action {action!r}: approve, reject, edit, restore, retire or split")

    # --- health ------------------------------------------------------------------------------------
    def _grpc_healthy(self, service: str) -> bool:
        try:
            with self._channel(service) as ch:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=self.timeout)
                return r.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def _metrics(self, service: str) -> str | None:
        addr = self.targets.metrics.get(service)
        if not addr:
            return None
        return scrape(addr, self.timeout)

    def health(self) -> dict[str, Any]:
        """Each service's health (gRPC health where it has one, its metrics endpoint otherwise), the spool
        depth of the inference pod, and consumer lag per group, topic and partition."""
        services: dict[str, Any] = {}
        texts = {name: self._metrics(name) for name in DEFAULT_METRICS}
        for name in DEFAULT_METRICS:
            healthy = self._grpc_healthy(name) if name in GRPC_SERVICES else texts[name] is not None
            services[name] = {"healthy": healthy, "target": self.targets.grpc.get(name, ""),
                              "metrics_port": self.targets.metrics.get(name)}
        spool = metric_sum(texts["inference"], INFERENCE_SPOOL_DEPTH)
        try:
            lag: Any = partition_lag(self.s.common)
        except Exception as e:  # noqa: BLE001 - the page shows what it can
            lag = {"error": str(e)}
        waiting = from_metrics(texts["grader"])
        return {"services": services, "spool_depth": spool, "lag": lag,
                "grader_waiting": {**(waiting.as_dict() if waiting else {}), "lines": describe(waiting)}}


def partition_lag(common: CommonSettings) -> list[dict[str, Any]]:
    """Rows (group, topic, partition, committed, end, lag) for every consumer group of this namespace on our
    topics; the dashboards' own groups (which never commit) are left out."""

    topics = common.topics
    return [{"group": r.group, "topic": topics.base_of(r.topic), "partition": r.partition,
             "committed": r.committed, "end": r.end, "lag": r.lag}
            for r in read_lag(common.kafka_bootstrap, topics, security=common,
                              skip_groups=(topics.group_id(GROUP_PREFIX),))]
