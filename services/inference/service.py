"""The inference service's handle (shared/service.py): engine + capture + hot swap + the gRPC server
(servicer.py) and the OpenAI-compatible HTTP API (openai_api/), and the request steps both doors share.

Request path (one handler thread per call): authenticate -> validate -> route to a version -> submit
to the engine -> wait (deadline-aware; a cancelled call cancels its generation) -> respond. Capture is
an enqueue after the answer is built; Kafka never sits on this path.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Generator, Sequence
from datetime import UTC
from typing import Any

import grpc

from services.inference import metrics
from services.inference.capture import CaptureSink
from services.inference.engines import create_engine
from services.inference.engines.base import (
    ChoiceDone,
    Delta,
    Engine,
    EngineError,
    EngineStopped,
    GenerationRequest,
    RequestHandle,
    UnknownVersion,
)
from services.inference.feedback_guard import FeedbackGuard, FeedbackLimits
from services.inference.hotswap import (
    Heartbeater,
    UpdateFollower,
    VersionManager,
    prune_versions_dir,
    versions_root,
)
from services.inference.knowledge import ServedKnowledge, follow_knowledge
from services.inference.openai_api import start_http
from services.inference.privacy import CapturePrivacy
from services.inference.quotas import Lease, QuotaExceeded, TenantQuotas
from services.inference.requests import (
    Completion,
    PreparedRequest,
    feedback_event,
    fit_completion,
    injected_delay,
    interaction_event,
    prepare,
    resolve_tenant,
    wait_result,
)
from services.inference.servicer import FeedbackServicer, InferenceServicer
from services.inference.settings import InferenceSettings
from services.inference.spool import Spool
from services.inference.trajectory import SessionTurns, best, head_key, turn_of
from shared.contracts.topic_access import INFERENCE
from shared.kafka.deadletter import DeadLetterPublisher
from shared.kafka.producer import EventProducer
from shared.kafka.trust import record_signer
from shared.knowledge.follow import SnapshotFollower
from shared.logs import trace_id_var
from shared.proto.apprentice.v1 import events_pb2, inference_pb2, inference_pb2_grpc
from shared.retry import call
from shared.rpc.grpc_util import (
    ServiceError,
    Unavailable,
    create_server,
    graceful_stop,
    metadata_value,
    remaining_s,
    set_serving,
)
from shared.security import interaction_ids
from shared.security.identity import current_identity

log = logging.getLogger(__name__)


SERVICE_NAMES = ("apprentice.v1.Inference", "apprentice.v1.Feedback")


class InferenceApp:
    """The service's handle: owns the engine, the capture sink, the version manager and the gRPC server.
    `start()` binds and loads, then reports SERVING; `stop()` drains; health, not the handle, reports a
    failed engine (NOT_SERVING: load balancers route around the pod), so `wait` ends only on `stop()`."""

    def __init__(self, settings: InferenceSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or create_engine(settings.engine.kind, settings)
        self.model = settings.common.model
        self.topics = settings.common.topics
        self.capture: CaptureSink | None = None
        self.turns = SessionTurns()    # each session's last served choices: agent trajectories (trajectory.py)
        self.dead_producer: EventProducer | None = None   # signed dead letters of refused orders/snapshots
        self.manager: VersionManager | None = None
        self.follower: UpdateFollower | None = None
        self.heartbeater: Heartbeater | None = None
        self.server: grpc.Server | None = None
        self.health: Any = None
        self.port = 0
        self.http: Any = None            # the OpenAI-compatible HTTP listener (openai_api/), when http_port
        self.http_port = 0
        self.ready = threading.Event()
        self._stopped = threading.Event()
        self.feedback_guard = FeedbackGuard(FeedbackLimits(
            max_per_interaction=settings.feedback.max_per_interaction,
            max_bytes_per_interaction=settings.feedback.max_bytes_per_interaction,
            max_comment_chars=settings.feedback.max_comment_chars,
            clock_skew_s=settings.feedback.clock_skew_s), settings.common.interaction_id_key())
        self.privacy = CapturePrivacy(settings, lambda: self.engine.tokenizer)
        self.knowledge: ServedKnowledge | None = None          # knowledge in context (knowledge.py)
        self.knowledge_follower: SnapshotFollower | None = None
        self.quotas = TenantQuotas.from_settings(settings)

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Listen at once (health NOT_SERVING), load the model, follow updates, then report SERVING
        (`port` is the bound gRPC port). A failure on the way stops whatever was already started and
        re-raises."""
        try:
            self._start()
        except BaseException:
            self.stop(grace=0)
            raise

    def _start(self) -> None:
        s = self.settings
        # Loaded once, before anything listens: a missing private key (signatures required) stops the start
        # with SigningKeyMissing (shared/startup.py reports it in one line).
        signer = record_signer(s.common, INFERENCE)
        if s.api_keys:
            log.warning("APPRENTICE_INFERENCE_API_KEYS is deprecated: use backend entries in APPRENTICE_AUTH_KEYS")
        if s.fault_delay_s > 0:
            log.warning("fault injection on: every generation request is delayed by %.1f s "
                        "(APPRENTICE_INFERENCE_FAULT_DELAY_S; tests and chaos drills only)", s.fault_delay_s)
        self.server, self.port, self.health = create_server(
            s.port, self._register, SERVICE_NAMES, host=s.host, max_workers=s.grpc_workers, common=s.common,
            extra_keys=s.legacy_key_entries())
        set_serving(self.health, SERVICE_NAMES, serving=False)
        self.server.start()
        log.info("inference listening", extra={"port": self.port, "engine": s.engine.kind, "model": self.model})
        if s.http_port:
            self.http = start_http(self)
            self.http_port = self.http.port

        self.capture = CaptureSink(s.common.kafka_bootstrap, Spool(
            s.spool_path, max_bytes=s.spool_max_bytes, segment_bytes=s.spool_segment_bytes),
            client_id=f"inference-{s.pod_id}", max_inflight=s.capture_max_inflight,
            delivery_timeout_ms=s.capture_delivery_timeout_ms, signer=signer).start()
        self.dead_producer = EventProducer(s.common.kafka_bootstrap, client_id=f"inference-{s.pod_id}-deadletter",
                                           signer=signer)
        dead = DeadLetterPublisher(self.dead_producer, self.topics.deadletter, source=f"inference/{s.pod_id}")
        self.privacy.start_warming()
        self.engine.start()
        metrics.MODEL_LOADED.set(1)
        prune_versions_dir(versions_root(s), keep=set())
        host = s.host if s.host not in ("0.0.0.0", "::", "[::]") else socket.gethostname()
        advertised = s.advertised_endpoint or f"{host}:{self.port}"
        self.manager = VersionManager(s, self.engine, advertised_endpoint=advertised)
        if s.follow_updates:
            self.follower = UpdateFollower(s, self.manager, dead=dead).start()
            if not self.follower.caught_up.wait(s.startup_catchup_s):
                log.warning("model-updates backlog not read within %.0fs; serving the base model meanwhile",
                            s.startup_catchup_s)
        if s.heartbeat_interval_s > 0:
            self.heartbeater = Heartbeater(s, self.manager).start()
        if s.knowledge.in_context or any(s.knowledge.tenants.values()):
            self.knowledge = ServedKnowledge(s)
            self.knowledge_follower = follow_knowledge(s, self.knowledge, dead)
            if not self.knowledge_follower.caught_up.wait(s.startup_catchup_s):
                log.warning("knowledge backlog not read within %.0fs; serving without it meanwhile",
                            s.startup_catchup_s)
        self.privacy.wait_warm()
        set_serving(self.health, SERVICE_NAMES, serving=True)
        self.ready.set()
        threading.Thread(target=self._watch_engine, name="engine-health", daemon=True).start()
        log.info("inference serving", extra={"port": self.port, "versions": self.engine.loaded_versions()})

    def stop(self, grace: float | None = None) -> None:
        """Graceful: NOT_SERVING, refuse new calls, let in-flight ones finish, flush capture."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings.grace_s if grace is None else grace
        t0 = time.monotonic()
        if self.http is not None:
            self.http.begin_stop(grace)  # refuses new connections now; drains alongside gRPC
        if self.server is not None:
            graceful_stop(self.server, self.health, grace)
        if self.http is not None:
            self.http.join(max(0.5, grace - (time.monotonic() - t0)))
        self.engine.shutdown(timeout=max(0.5, grace - (time.monotonic() - t0)))
        for part in (self.follower, self.heartbeater, self.knowledge_follower):
            if part is not None:
                part.stop()
        if self.manager is not None:
            self.manager.close()
        if self.capture is not None:
            self.capture.close(timeout=max(1.0, grace - (time.monotonic() - t0)))
        if self.dead_producer is not None:
            self.dead_producer.close(timeout=2.0)
        metrics.MODEL_LOADED.set(0)
        log.info("inference stopped")

    def _watch_engine(self) -> None:
        """Health follows the engine: a dead scheduler turns the pod NOT_SERVING (load balancers and
        orchestrators then route around it / restart it)."""
        while not self._stopped.wait(1.0):
            if not self.engine.healthy():
                set_serving(self.health, SERVICE_NAMES, serving=False)
                metrics.MODEL_LOADED.set(0)
                log.critical("engine unhealthy: reporting NOT_SERVING")
                return

    def wait(self, timeout: float | None = None) -> bool:
        """True once `stop()` ran (the service never stops by itself: see the class)."""
        return self._stopped.wait(timeout)

    @property
    def exit_code(self) -> int:
        return 0

    def _register(self, server: grpc.Server) -> None:
        inference_pb2_grpc.add_InferenceServicer_to_server(InferenceServicer(self), server)
        inference_pb2_grpc.add_FeedbackServicer_to_server(FeedbackServicer(self), server)

    # --- shared request steps ---------------------------------------------------------------------
    def check_ready(self) -> None:
        """The readiness rule every call of either door passes (`prepare`, and the HTTP API's /health)."""
        if not self.ready.is_set() or self.manager is None:
            raise Unavailable("the model is still loading; retry shortly")
        if not self.engine.healthy():
            raise Unavailable("the engine on this replica has failed; retry on another replica")
        if self._stopped.is_set():
            raise Unavailable("this server is shutting down; retry on another replica")

    def prepare(self, request: inference_pb2.GenerateRequest, context: Any) -> PreparedRequest:
        self.check_ready()
        trace_id_var.set(metadata_value(context, "x-trace-id") or uuid.uuid4().hex)
        tenant = resolve_tenant(request.tenant, context, self.settings)
        tok, window = self.engine.tokenizer, self.engine.context_window
        p = prepare(request, tenant, self.settings, tok, window, new_session_id=str(uuid.uuid4()))
        # p.prompt (services/inference/prompt.py) is rebuilt by each step below from its inputs: what comes out
        # is what the engine receives and what every choice's Interaction records
        self.privacy.screen_request(p)
        self.privacy.redact_prompt(p)
        if p.prompt.redacted:           # a placeholder may take more tokens than the value it replaced
            fit_completion(p, window, " once its personal data is redacted")
        if self.knowledge is not None:
            self.knowledge.augment(p, tok, window)
        identity = current_identity()
        p.principal = identity.to_principal() if identity is not None else None
        return p

    def new_interaction_ids(self, p: PreparedRequest, n: int) -> list[str]:
        """Ids bound to the request's tenant by a MAC, so feedback on them can be checked at the edge."""
        return [interaction_ids.issue(p.tenant, self.feedback_guard.id_key) for _ in range(n)]

    def submit(self, p: PreparedRequest, context: Any, stream: bool,
               pin: tuple[str, bool] | None = None) -> tuple[RequestHandle, str, bool]:
        """Route and queue; a version swapped out between routing and queueing is routed again (3 tries).
        `pin` = (version, canary): serve that version instead of routing (an HTTP request naming one)."""
        assert self.manager is not None
        if self.settings.fault_delay_s > 0:
            injected_delay(self.settings.fault_delay_s, context)
        remaining = remaining_s(context)
        deadline = time.monotonic() + remaining if remaining is not None else None
        lease = self._admit(p)                    # tenant quotas: RESOURCE_EXHAUSTED with retry_after_s
        manager, routed = self.manager, []

        def queue() -> RequestHandle:
            routed.append(pin if pin is not None else manager.route(p.tenant))
            return self.engine.submit(GenerationRequest(
                request_id=str(uuid.uuid4()), prompt_ids=p.prompt_ids, sampling=p.sampling,
                version=routed[-1][0], stream=stream, deadline=deadline, tenant=p.tenant))

        try:
            handle = call(queue, retry_on=UnknownVersion, what="routing", attempts=3, first_s=0.0, max_s=0.0)
        except BaseException as e:
            lease.release()
            if isinstance(e, UnknownVersion):
                raise Unavailable(f"version {routed[-1][0]} is being swapped; retry") from None
            if isinstance(e, EngineStopped):
                raise Unavailable(str(e)) from e
            raise
        version, canary = routed[-1]
        handle.add_done_callback(lambda h: lease.release(h.generated_tokens))
        context.add_callback(handle.cancel)   # client cancelled or deadline passed: stop generating
        return handle, version, canary

    def _admit(self, p: PreparedRequest) -> Lease:
        try:
            return self.quotas.admit(p.tenant, prompt_tokens=len(p.prompt_ids), samples=max(1, p.sampling.n))
        except QuotaExceeded as e:
            metrics.QUOTA_REFUSED.labels(reason=e.reason).inc()
            raise

    def record(self, p: PreparedRequest, samples: list[Any], ids: list[str], group_id: str, version: str,
               canary: bool, latency_ms: float) -> None:
        """Choices --> Interaction events on the capture queue (unless opted out)."""
        assert self.capture is not None
        if p.no_capture:
            metrics.CAPTURE_SKIPPED.labels(reason="request").inc(len(samples))
            return
        if not self.settings.capture or p.tenant in self.settings.no_capture_tenants:
            metrics.CAPTURE_SKIPPED.labels(reason="tenant").inc(len(samples))
            return
        trace = trace_id_var.get()
        events = [interaction_event(p, sample, interaction_id=iid, group_id=group_id, index=i, model=self.model,
                                    version=version, canary=canary, pod=self.settings.pod_id,
                                    latency_ms=latency_ms, trace_id=trace)
                  for i, (sample, iid) in enumerate(zip(samples, ids, strict=True))]
        captured = self._trajectories(p, events)
        tickets = [self.capture.submit(self.topics.interactions, ev.session_id, ev) for ev in captured]
        # the answer leaves only once its interactions are on disk (services/inference/capture.py)
        deadline = time.monotonic() + self.settings.capture_ack_timeout_s
        missed = sum(not t.wait(max(0.0, deadline - time.monotonic())) for t in tickets)
        if missed:
            metrics.CAPTURE_UNSPOOLED.inc(missed)

    def _trajectories(self, p: PreparedRequest, events: list[events_pb2.Interaction]
                      ) -> Sequence[events_pb2.Interaction]:
        """Events --> their captured copies, each a later turn of its session's agent trajectory when this pod
        served the turn before it (services/inference/trajectory.py; docs/agents.md, "Agent trajectories").
        The session's choices are then remembered as they were served (a redacted prompt was redacted before
        it was served, so it holds the tokens the model saw); a captured copy that lost its prompt (a failed
        PII check, services/inference/privacy.py) neither carries nor continues a trajectory."""
        caller = p.principal.key_id if p.principal is not None else ""
        key = f"{p.tenant}\x00{caller}\x00{p.session_id}"      # one caller's session, never another's
        head = head_key(p.tenant, p.prompt_ids, caller)
        found = best(self.turns.get(key) or self.turns.by_head(head), p.prompt_ids)
        traj = found[0] if found is not None else None
        if found is not None and found[1].session_key != key:
            self.turns.forget(found[1].session_key)
        if traj is None:
            metrics.TRAJECTORY_TURNS.labels(outcome="first").inc(len(events))
        else:
            moved = found is not None and found[1].session_key != key
            metrics.TRAJECTORY_TURNS.labels(outcome="by_history" if moved else "continued").inc(len(events))
            env = sum(traj.environment)
            metrics.TRAJECTORY_TOKENS.labels(kind="model").inc(len(traj.environment) - env)
            metrics.TRAJECTORY_TOKENS.labels(kind="environment").inc(env)
            metrics.TRAJECTORY_TOKENS.labels(kind="realigned").inc(traj.realigned_tokens)
        if traj is not None:
            for ev in events:
                ev.trajectory.CopyFrom(traj)
        # the choices share one prompt: redacted once for all of them (services/inference/privacy.py);
        # keyed by the session's pseudonym, never the caller's raw session id (or OpenAI `user`)
        captured = self.privacy.interactions(p, events)
        remembered = []
        for ev in captured:
            if list(ev.prompt_token_ids) != list(p.prompt_ids):
                ev.ClearField("trajectory")
                continue
            turn = turn_of(ev)
            if turn is not None:
                remembered.append(turn)
        if remembered or traj is not None:
            self.turns.put(key, remembered, head)
        return captured

    def account(self, samples: list[Any], version: str, canary: bool, ok: bool) -> None:
        assert self.manager is not None
        if ok:
            metrics.SERVED.labels(version=version, canary=str(canary).lower()).inc(len(samples))
        self.manager.note_result(version, canary, ok)

    # --- whole calls, shared by the gRPC servicers and the HTTP API --------------------------------
    def complete(self, p: PreparedRequest, context: Any, t0: float,
                 pin: tuple[str, bool] | None = None) -> Completion:
        """A unary call after `prepare`: generate, issue the interaction ids, capture."""
        samples, version, canary = self._generate(p, context, pin)
        ids = self.new_interaction_ids(p, len(samples))
        self.record(p, samples, ids, group_id=str(uuid.uuid4()), version=version, canary=canary,
                    latency_ms=(time.perf_counter() - t0) * 1000)
        return Completion(samples, ids, version, canary)

    def _generate(self, p: PreparedRequest, context: Any,
                  pin: tuple[str, bool] | None) -> tuple[list[Any], str, bool]:
        routed: list[str] = []

        def once() -> tuple[RequestHandle, list[Any], str, bool]:
            handle, version, canary = self.submit(p, context, stream=False, pin=pin)
            routed.append(version)
            try:
                return handle, wait_result(handle, context), version, canary
            except ServiceError:
                self.account([], version, canary, ok=False)
                raise

        try:   # swapped out before it started: routed again, once
            handle, samples, version, canary = call(once, retry_on=UnknownVersion, what="generation", attempts=2,
                                                    first_s=0.0, max_s=0.0)
        except UnknownVersion:
            raise Unavailable(f"version {routed[-1]} is being swapped; retry") from None
        self.account(samples, version, canary, ok=True)
        if handle.first_token_at is not None:
            metrics.TIME_TO_FIRST_TOKEN.observe(handle.first_token_at - handle.submitted_at)
        return samples, version, canary

    def stream(self, p: PreparedRequest, context: Any, t0: float,
               pin: tuple[str, bool] | None = None) -> tuple[str, list[str], Generator[Delta | ChoiceDone, None, None]]:
        """A streaming call after `prepare`: (version, interaction ids, engine events). Exhausting the
        events accounts and captures the call; closing them early (the client went away) cancels it."""
        handle, version, canary = self.submit(p, context, stream=True, pin=pin)
        ids = self.new_interaction_ids(p, p.sampling.n)
        return version, ids, self._stream_events(p, context, handle, version, canary, ids, t0)

    def _stream_events(self, p: PreparedRequest, context: Any, handle: RequestHandle, version: str, canary: bool,
                       ids: list[str], t0: float) -> Generator[Delta | ChoiceDone, None, None]:
        n = p.sampling.n
        samples: dict[int, Any] = {}
        remaining = remaining_s(context)
        try:
            for ev in handle.events(timeout=None if remaining is None else remaining + 5.0):
                if isinstance(ev, ChoiceDone):
                    samples[ev.index] = ev.sample
                    if len(samples) == n:       # captured before the client sees the end of its answer
                        self._finish_stream(p, handle, version, canary, ids, samples, t0)
                yield ev
        except TimeoutError:
            handle.cancel()
            raise Unavailable("generation did not finish before the deadline") from None
        except UnknownVersion:
            raise Unavailable(f"version {version} was swapped out before the request started; retry") from None
        except EngineError as e:
            self.account([], version, canary, ok=False)
            raise ServiceError(str(e)) from e
        finally:
            if len(samples) < n:
                handle.cancel()       # the client went away mid-stream

    def _finish_stream(self, p: PreparedRequest, handle: RequestHandle, version: str, canary: bool,
                       ids: list[str], samples: dict[int, Any], t0: float) -> None:
        ordered = [samples[i] for i in range(p.sampling.n)]
        self.account(ordered, version, canary, ok=True)
        if handle.first_token_at is not None:
            metrics.TIME_TO_FIRST_TOKEN.observe(handle.first_token_at - handle.submitted_at)
        self.record(p, ordered, ids, group_id=str(uuid.uuid4()), version=version, canary=canary,
                    latency_ms=(time.perf_counter() - t0) * 1000)

    def submit_feedback(self, request: inference_pb2.FeedbackRequest, context: Any) -> inference_pb2.FeedbackAck:
        """FeedbackRequest --> checked (owner, time, caps) --> the feedback topic."""
        if self.capture is None:
            raise Unavailable("the server is starting; retry shortly")
        tenant = resolve_tenant(request.tenant, context, self.settings)
        guard = self.feedback_guard
        guard.check_owner(request.interaction_id, tenant)
        event = self.privacy.feedback(feedback_event(request, tenant, self.settings.pod_id))
        guard.check_time(request.interaction_id, event.envelope.occurred_at.ToDatetime(tzinfo=UTC))
        guard.admit(request.interaction_id, request.comment)
        if tenant in self.settings.no_capture_tenants:
            metrics.CAPTURE_SKIPPED.labels(reason="tenant").inc()
            return inference_pb2.FeedbackAck(event_id=event.envelope.event_id, accepted=False)
        ticket = self.capture.submit(self.topics.feedback, request.interaction_id, event)
        if not ticket.wait(self.settings.capture_ack_timeout_s):    # acknowledged = on disk
            raise Unavailable("the feedback could not be recorded right now; retry with the same occurred_at")
        return inference_pb2.FeedbackAck(event_id=event.envelope.event_id, accepted=True)


def serve(settings: InferenceSettings) -> InferenceApp:
    """A started InferenceApp (tests and tools that serve in-process); `.stop()` shuts it down."""
    app = InferenceApp(settings)
    app.start()
    return app
