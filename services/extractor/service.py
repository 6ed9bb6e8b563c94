"""Wiring: graded topic --> sessions --> extraction --> knowledge snapshots on the compacted topic, plus the
Knowledge gRPC server (servicer.py); `ExtractorApp` is the service's handle (shared/service.py).

Delivery: at least once with idempotent effects. A poll's records join open sessions; closed sessions are
extracted, applied and published (flush = durable); only then are offsets committed, and never past the
first record of a session that is still open. The extraction call (the Inference service, possibly slow or
restarting) runs on a worker thread while the consumer keeps polling with its partitions paused
(shared/kafka/busy.py), so a slow LLM delays extraction but never costs the group membership. A
redelivered record whose (interaction, revision) is in the base's `processed` list changes nothing.
Start-up rebuilds every base from the knowledge topic before serving or consuming, so a restarted
extractor continues the version numbers where they were.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from services.extractor.consolidation import ConsolidationFollower
from services.extractor.curation import Curator, Embedder, TokenCounter, approx_tokens
from services.extractor.extraction import ExtractionSettings, Extractor, RateLimiter
from services.extractor.knowledge import Extracted, KnowledgeStore
from services.extractor.llm import ExtractorLLM, LLMUnavailable
from services.extractor.llm_kinds import make_llm
from services.extractor.metrics import ITEMS, LLM_CALLS, LLM_ERRORS, OPEN_SESSIONS, SNAPSHOTS, TRAJECTORIES
from services.extractor.servicer import SERVICE, create_knowledge_server
from services.extractor.settings import ExtractorSettings
from services.extractor.snapshots import read_snapshots
from services.extractor.trajectories import SessionBuffer, Trajectory
from shared.audit import AuditLog
from shared.decoding.chat_template import special_token_strings
from shared.kafka import DeadLetterPublisher, DeliveryError, EventConsumer, EventProducer, ensure_topics
from shared.kafka.busy import WorkAbandoned
from shared.kafka.decode import decode_batch
from shared.kafka.trust import RecordTrust, UntrustedRecord, record_signer
from shared.knowledge.embeddings import EmbeddingsUnavailable, MiniLMEmbedder
from shared.models import load_tokenizer
from shared.privacy.injection_screen import InjectionScreen
from shared.proto.apprentice.v1 import events_pb2, weights_pb2_grpc
from shared.retry import Backoff
from shared.rpc.grpc_util import graceful_stop, set_serving
from shared.security.channels import open_channel

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _policy_tokenizer(model_name: str) -> Any:
    """The policy's tokenizer, loaded once per process; None when it cannot be loaded here."""
    try:
        return load_tokenizer(model_name)
    except Exception as e:  # noqa: BLE001 - approximations beat not starting
        log.warning("tokenizer of %s unavailable here: %s", model_name, e)
        return None


def policy_screen(model_name: str) -> InjectionScreen:
    """The injection screen with the policy tokenizer's own special tokens added to the common ones."""

    tok = _policy_tokenizer(model_name)
    return InjectionScreen(tuple(special_token_strings(tok)) if tok is not None else ())


def policy_token_counter(model_name: str) -> TokenCounter:
    """Count tokens with the policy's tokenizer (the knowledge goes into its context); ~4 chars/token when
    the tokenizer cannot be loaded here."""
    tok = _policy_tokenizer(model_name)
    if tok is None:
        log.warning("token counts approximated (no tokenizer of %s)", model_name)
        return approx_tokens

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])
    return count


def _position(rec: Any) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record."""
    return rec.topic() or "", int(rec.partition() or 0), int(rec.offset() or 0)


class ExtractorApp:
    """The extractor's handle (shared/service.py): the knowledge store behind the Knowledge gRPC server,
    and the consumer thread that extracts from the graded topic. `wait` ends only on `stop()` (a failing
    poll is retried: its records are redelivered)."""

    def __init__(self, settings: ExtractorSettings, llm: ExtractorLLM | None = None, *,
                 embedder: Embedder | None = None, count_tokens: TokenCounter | None = None,
                 clock: Callable[[], float] = time.monotonic, screen: InjectionScreen | None = None) -> None:
        self.settings = settings
        common = settings.common
        self.topics = common.topics
        # Snapshots, audit records and dead letters carry the extractor's signature (a missing key stops
        # the start: shared/startup.py); graded records are accepted only from the grader
        # (shared/contracts/topic_access.py), anything else is dead-lettered with the reason.
        self.producer = EventProducer(common.kafka_bootstrap, client_id="extractor",
                                      signer=record_signer(common, "extractor"))
        self.deadletters = DeadLetterPublisher(self.producer, self.topics.deadletter, source="extractor")
        self.graded_trust = RecordTrust.from_settings(common)
        if embedder is None and settings.embedding_dedupe:
            try:
                embedder = MiniLMEmbedder()
            except EmbeddingsUnavailable as e:
                log.warning("knowledge items are compared by words only: %s", e)
        curator = Curator(min_chars=settings.min_item_chars, max_chars=settings.max_item_chars,
                          near_threshold=settings.near_duplicate_threshold,
                          embedding_threshold=settings.embedding_threshold, harmful_margin=settings.harmful_margin,
                          count_tokens=count_tokens or policy_token_counter(common.model), embedder=embedder)
        self.store = KnowledgeStore(curator, self._publish, requires_approval=settings.tenant_requires_approval,
                                    max_tokens=settings.max_tokens, max_rejected_kept=settings.max_rejected_kept,
                                    max_processed_kept=settings.max_processed_kept,
                                    screen=screen or policy_screen(common.model),
                                    business_data=common.business_data_for)
        self.buffer = SessionBuffer(settings.session_gap_s, settings.max_turns, clock)
        self.llm = llm or make_llm(settings)
        self.extractor = Extractor(self.llm, ExtractionSettings(
            max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, top_p=settings.top_p,
            top_k=settings.top_k, batch_size=settings.batch_size, max_items=settings.max_items_per_trajectory,
            max_turn_chars=settings.max_turn_chars, include_previous=settings.include_previous_knowledge,
            correction_items=settings.correction_items, llm_items=settings.llm_items, retries=settings.retries),
            RateLimiter(settings.rate_limit_per_s, settings.rate_burst))
        self.consumer: EventConsumer | None = None
        self.server: Any = None
        self.health: Any = None
        self.port = 0
        self._committed: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.consolidation: ConsolidationFollower | None = None
        self._weights_channel: Any = None

    # --- durability ------------------------------------------------------------------------------------
    def _publish(self, snap: events_pb2.KnowledgeSnapshot) -> None:
        """Durable write of one snapshot (raises DeliveryError: the store then keeps its old state)."""
        self.producer.produce(self.topics.knowledge, snap.key, snap)
        self.producer.flush(timeout=30.0)
        SNAPSHOTS.inc()
        log.info("knowledge snapshot published", extra={"key": snap.key, "version": snap.version,
                                                         "items": len(snap.items), "change": snap.change})

    def rebuild(self, timeout: float = 30.0) -> int:
        """Load every trusted snapshot from the compacted topic; returns how many records were loaded.
        A snapshot not signed by the extractor, or older than the one of its key already loaded, is
        dead-lettered and never loaded: a forged record on the topic must not replace a tenant's
        knowledge at the next start."""
        trust = RecordTrust.from_settings(self.settings.common, monotonic=True)

        def refused(msg: Any, e: UntrustedRecord) -> None:
            self.deadletters.publish(msg, stage="extractor.rebuild", reason=str(e), error_type=type(e).__name__)

        snaps = read_snapshots(self.settings.common.kafka_bootstrap, self.topics.knowledge, timeout=timeout,
                               trust=trust, on_untrusted=refused)
        for s in snaps:
            self.store.load(s)
        log.info("knowledge rebuilt from topic", extra={"records": len(snaps), "bases": len(self.store.base_keys())})
        return len(snaps)

    # --- life cycle ----------------------------------------------------------------------------------------
    def start(self, *, consume: bool = True) -> None:
        """Rebuild, serve gRPC (`port` is the bound port), then (optionally) consume in a background
        thread. A failure on the way closes what was opened and re-raises."""
        try:
            ensure_topics(self.settings.common.kafka_bootstrap, self.topics)
            self.rebuild()
            self.server, self.port, self.health = create_knowledge_server(
                self.store, self.settings.port, self.settings.host, common=self.settings.common,
                audit=AuditLog(self.producer, self.topics, source="extractor"))
            self.server.start()
            set_serving(self.health, [SERVICE])
            if consume:
                self.open_consumer()
                self._thread = threading.Thread(target=self._run, name="extractor-consumer", daemon=True)
                self._thread.start()
                if self.settings.consolidation:
                    self._weights_channel = open_channel(self.settings.weights_endpoint, self.settings.common)
                    self.consolidation = ConsolidationFollower(
                        self.store, self.settings.common.kafka_bootstrap, self.topics.model_updates,
                        self.topics.group_id(self.settings.consolidation_group_id),
                        weights_pb2_grpc.WeightsStub(self._weights_channel),
                        trust=RecordTrust.from_settings(self.settings.common, monotonic=True),
                        deadletters=self.deadletters).start()
        except BaseException:
            self.stop(grace=0)
            raise

    def open_consumer(self) -> EventConsumer:
        if self.consumer is None:
            poll_ms = int(self.settings.max_poll_interval_s * 1000)
            self.consumer = EventConsumer(self.settings.common.kafka_bootstrap,
                                          self.topics.group_id(self.settings.group_id), [self.topics.graded],
                                          max_poll_interval_ms=poll_ms,
                                          session_timeout_ms=min(10_000, poll_ms))
        return self.consumer

    def _run(self) -> None:
        backoff = Backoff(1.0, 5.0)
        while not self._stop.is_set():
            try:
                self.poll_once()
                backoff.reset()
            except Exception:  # noqa: BLE001 - keep consuming; uncommitted records are redelivered
                log.exception("extractor poll failed; retrying")
                self._stop.wait(backoff.next())

    def stop(self, grace: float | None = None) -> None:
        """Stop consuming (the batch in progress ends first), drain gRPC within `grace` (default:
        `grace_s`), close the clients; a second call does nothing."""
        self._stop.set()
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.consolidation is not None:
            self.consolidation.stop()
        if self._weights_channel is not None:
            self._weights_channel.close()
        if self.server is not None:
            graceful_stop(self.server, self.health, self.settings.grace_s if grace is None else grace)
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        self.producer.close()
        self.llm.close()

    # --- one step --------------------------------------------------------------------------------------
    def poll_once(self) -> int:
        """Poll a batch, process closed sessions, commit what is safe; returns trajectories applied."""
        consumer = self.open_consumer()
        records = consumer.poll_batch(self.settings.poll_max_records, self.settings.poll_timeout_s)
        for rec in records:
            self.buffer.note_consumed(*_position(rec))
        trusted = []
        for rec in records:
            try:
                self.graded_trust.check(rec)
                trusted.append(rec)
            except UntrustedRecord as e:
                self.deadletters.publish(rec, stage="extractor.trust", reason=str(e), error_type=type(e).__name__)
        for rec, g in decode_batch(trusted, events_pb2.GradedInteraction, self.deadletters,
                                   stage="extractor.decode"):
            topic, partition, offset = _position(rec)
            self.buffer.add(g, topic=topic, partition=partition, offset=offset)
        n = self.process_ready()
        self._commit()
        return n

    def process_ready(self, *, flush_all: bool = False) -> int:
        """Extract and apply every closed session. Sessions whose extraction or publication failed stay
        open (and keep their offsets uncommitted) for the next poll."""
        ready = self.buffer.ready(flush_all=flush_all)
        OPEN_SESSIONS.set(len(self.buffer))
        if not ready:
            return 0
        todo: list[Trajectory] = []
        done: list[Trajectory] = []
        for traj, _offsets in ready:
            new = [t for t in traj.turns if self.store.is_new(traj.key, t.interaction_id, t.revision)]
            if not new:
                TRAJECTORIES.labels("already_applied").inc()
                done.append(traj)
            elif not any(t.informative for t in new):
                TRAJECTORIES.labels("no_signal").inc()
                done.append(traj)
            else:
                todo.append(traj)
        self.buffer.release(done)
        if not todo:
            return 0
        try:
            calls_before, echoes_before = self.extractor.calls, self.extractor.echoes
            results = self._extract(todo)
            LLM_CALLS.inc(self.extractor.calls - calls_before)
            ITEMS.labels("echo").inc(self.extractor.echoes - echoes_before)
        except LLMUnavailable as e:
            LLM_ERRORS.inc()
            log.warning("extraction postponed: %s", e)
            return 0
        except WorkAbandoned:
            log.info("stopping during extraction; its sessions stay uncommitted and are redelivered")
            return 0
        by_key: dict[str, list[Extracted]] = defaultdict(list)
        for r in results:
            by_key[r.trajectory.key].append(r)
        applied = 0
        for key, batch in by_key.items():
            try:
                _snap, verdicts = self.store.apply(key, batch)
            except DeliveryError as e:
                log.error("snapshot for %s not durable, will retry: %s", key, e)
                continue
            for v in verdicts:
                ITEMS.labels(v.outcome).inc()
                if v.outcome == "rejected":
                    log.info("item rejected", extra={"key": key, "reason": v.reason})
                if v.flags:
                    ITEMS.labels("flagged").inc()
                    log.warning("item flagged by the injection screen; it waits for review",
                                extra={"key": key, "item_id": v.item_id, "flags": ",".join(v.flags)})
            TRAJECTORIES.labels("extracted").inc(len(batch))
            self.buffer.release(r.trajectory for r in batch)
            applied += len(batch)
        OPEN_SESSIONS.set(len(self.buffer))
        return applied

    def _extract(self, todo: list[Trajectory]) -> list[Extracted]:
        """The LLM step; with a consumer, on a worker thread while the consumer keeps its membership
        (corrections-only extraction makes no call and runs here)."""
        if self.consumer is None or not self.settings.llm_items:
            return self.extractor.extract(todo, self.store.active_texts)
        return self.consumer.call_while_polling(lambda: self.extractor.extract(todo, self.store.active_texts),
                                                stop=self._stop)

    def _commit(self) -> None:
        if self.consumer is None:
            return
        safe = {tp: off for tp, off in self.buffer.safe_offsets().items() if self._committed.get(tp) != off}
        if safe:
            self.consumer.commit_offsets(safe)
            self._committed.update(safe)

    def wait(self, timeout: float | None = None) -> bool:
        """True once `stop()` was called."""
        return self._stop.wait(timeout)

    @property
    def exit_code(self) -> int:
        return 0
