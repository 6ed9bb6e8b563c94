"""The trainer's handle (shared/service.py): the Weights channel and the training loop (loop.py) on a thread
of its own. Ranks > 0 under torchrun run `loop.follower` instead."""

from __future__ import annotations

import logging
import threading
from typing import Any

from services.trainer.loop import TrainerService
from services.trainer.settings import TrainerSettings
from shared.proto.apprentice.v1 import weights_pb2_grpc
from shared.security.channels import open_channel

log = logging.getLogger(__name__)


# Reconnect to a restarted Weights service within seconds (gRPC's default backoff grows to 2 minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 5000),
                   ("grpc.min_reconnect_backoff_ms", 500)]


class TrainerApp:
    """The trainer's handle (shared/service.py) for rank 0 / a single process: the Weights channel and a
    TrainerService whose loop runs on a thread of its own. `start` loads the model and the newest
    checkpoint (a startup error raises there); the loop ends on `stop()`, or by itself on an error
    (exit code 1; the checkpoint on disk is the restart's starting point). Ranks > 0 under torchrun run
    `follower` instead."""

    def __init__(self, settings: TrainerSettings) -> None:
        self.settings = settings
        self.service: TrainerService | None = None
        self._channel: Any = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._code = 0
        self._closed = False

    def start(self) -> None:
        try:
            self._channel = open_channel(self.settings.weights_endpoint, self.settings.common, options=CHANNEL_OPTIONS)
            self.service = TrainerService(self.settings, weights_pb2_grpc.WeightsStub(self._channel))
        except BaseException:
            self.stop(grace=0)
            raise
        self._thread = threading.Thread(target=self._loop, args=(self.service,), name="trainer-loop", daemon=True)
        self._thread.start()

    def _loop(self, service: TrainerService) -> None:
        try:
            service.run(self._stop)
        except Exception:
            log.exception("trainer loop stopped on an error")
            self._code = 1
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the loop has ended (on `stop()`, or by itself on an error)."""
        return self._done.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Stop after the step in progress (a round is never cut: its checkpoint would be lost), then
        close the readers, the producer and the channel; `grace` does not apply."""
        self._stop.set()
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._thread.join()
        try:
            if self.service is not None:
                self.service.close()
        finally:
            if self._channel is not None:
                self._channel.close()

    @property
    def exit_code(self) -> int:
        return self._code
