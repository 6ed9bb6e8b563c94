"""What the gRPC servicer (servicer.py) and the HTTP API (openai_api/) call of the app: a Protocol.

Both doors are typed against `Calls`, not against `InferenceApp` (service.py), so that service.py, which
builds the doors and hands itself to them, is the only module that knows the whole app, and neither
door imports back up (no import cycle, not even a type-only one). What a door may use is listed here and
nothing more: the request steps both doors share, the readiness rule, and the few facts the HTTP API
reads (settings, the served model's name, the version manager's routing table, the engine's tokenizer).
mypy checks that `InferenceApp` satisfies it where service.py passes itself to the doors.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from services.inference.engines.base import ChoiceDone, Delta, Engine
from services.inference.hotswap import VersionManager
from services.inference.requests import Completion, PreparedRequest
from services.inference.settings import InferenceSettings
from shared.proto.apprentice.v1 import inference_pb2


class Calls(Protocol):
    """The request steps of one inference server, as its two doors call them; InferenceApp implements it.

    `context` is the call's gRPC `ServicerContext`, or its HTTP stand-in (openai_api/auth.py
    `HttpCallContext`). `pin` = (version, canary) serves that version instead of routing the call.
    """

    @property
    def settings(self) -> InferenceSettings: ...

    @property
    def model(self) -> str:
        """The base model's name: what `/v1/models` lists and a request without `model` gets."""
        ...

    @property
    def manager(self) -> VersionManager | None:
        """The version manager (routing table); None until the service has started."""
        ...

    @property
    def engine(self) -> Engine: ...

    def check_ready(self) -> None:
        """Raise `Unavailable` unless this replica can serve now (loaded, engine healthy, not stopping)."""
        ...

    def prepare(self, request: inference_pb2.GenerateRequest, context: Any) -> PreparedRequest:
        """Readiness, tenant, validation, privacy screen, knowledge in context: the call before generating."""
        ...

    def complete(self, p: PreparedRequest, context: Any, t0: float,
                 pin: tuple[str, bool] | None = None) -> Completion:
        """A unary call after `prepare`: generate, issue the interaction ids, capture."""
        ...

    def stream(self, p: PreparedRequest, context: Any, t0: float,
               pin: tuple[str, bool] | None = None) -> tuple[str, list[str], Generator[Delta | ChoiceDone, None, None]]:
        """A streaming call after `prepare`: (version, interaction ids, engine events)."""
        ...

    def submit_feedback(self, request: inference_pb2.FeedbackRequest, context: Any) -> inference_pb2.FeedbackAck:
        """FeedbackRequest --> checked (owner, time, caps) --> the feedback topic."""
        ...
