"""The weights service's handle (shared/service.py): the gRPC server (servicer.py) over the model registry
(registry.py) and its background threads."""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from services.weights.registry import WeightsService
from services.weights.servicer import WeightsServicer
from services.weights.settings import WeightsSettings
from services.weights.wire import SERVICE_NAME, register
from shared.kafka import ensure_topics
from shared.rpc.grpc_util import create_server, graceful_stop, set_serving

log = logging.getLogger(__name__)


class RunningServer:
    """The weights service's handle (shared/service.py): the gRPC server over a WeightsService and its
    background threads. `consume=False` leaves the checkpoints topic alone (a store that only serves
    bytes: benchmarks, tests); with it, `start` first makes sure every topic exists."""

    def __init__(self, settings: WeightsSettings, *, consume: bool = True) -> None:
        self.settings = settings
        self.consume = consume
        self.service = WeightsService(settings)
        self.server: grpc.Server | None = None
        self.health: Any = None
        self.port = 0
        self._stopped = threading.Event()

    def start(self) -> None:
        """Bind (tests pass port 0 and read `.port`), start the background threads, report SERVING."""
        s = self.settings
        try:
            if self.consume:
                ensure_topics(s.common.kafka_bootstrap, s.common.topics)
            servicer = WeightsServicer(self.service)
            self.server, self.port, self.health = create_server(
                s.port, lambda srv: register(servicer, srv), [SERVICE_NAME], host=s.host, common=s.common)
            self.server.start()
            self.service.start_background(consume=self.consume)
        except BaseException:
            self.stop(grace=0)
            raise
        set_serving(self.health, [SERVICE_NAME])
        log.info("weights service serving", extra={"port": self.port, "store": str(s.store_root),
                                                   "policy": s.policy})

    def wait(self, timeout: float | None = None) -> bool:
        """True once `stop()` ran: the service never stops by itself (a failing consumer retries)."""
        return self._stopped.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Drain in-flight calls within `grace` (default: `grace_s`), then stop the background threads."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.server is not None:
            graceful_stop(self.server, self.health, self.settings.grace_s if grace is None else grace)
        self.service.stop()

    @property
    def exit_code(self) -> int:
        return 0


def start(settings: WeightsSettings, *, consume: bool = True) -> RunningServer:
    """A started RunningServer (tests, benchmarks); `.stop()` shuts it down."""
    running = RunningServer(settings, consume=consume)
    running.start()
    return running
