"""The training loop: graded + knowledge topics --> training rounds --> checkpoints --> versions in the Weights store.

The service loop (single thread, so nothing is in flight when a checkpoint is taken):
1. poll `graded` into the RL buffer and the prompt pool; poll `knowledge` into the knowledge base;
2. if the previous checkpoint is not yet published, retry publishing it and train nothing else;
3. when the schedule says so, run an RL round or an OEL consolidation round (`rounds.Trainer`);
4. write a checkpoint (weights, optimizer, the graded offsets read so far, the buffer), atomically;
5. upload the version and announce it; then commit the offsets to the consumer group (monitoring only).

Exactly once under kill -9: the checkpoint holds the next offset per partition P together with the
weights that include every trained record before P, the records before P still waiting in the buffer,
and the ids already trained. A restart loads the newest complete checkpoint and seeks to P, so each
record before P is in the weights exactly once or in the restored buffer, and each record after P is
read again: nothing lost, nothing trained twice. A crash between a round and its checkpoint loses the
round itself, whose records are then trained once by the restarted process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from services.trainer import metrics as M
from services.trainer.buffer import ACCEPTED, RolloutBuffer
from services.trainer.checkpoint import Checkpoint, CheckpointStore
from services.trainer.distill import DistillExample
from services.trainer.distributed import broadcast, world_size
from services.trainer.publish import Publisher, manifest_digest
from services.trainer.rollouts import MALFORMED, OTHER_TENANT, QUARANTINED, domain_of
from services.trainer.rounds import RoundResult, Trainer
from services.trainer.settings import TrainerSettings
from services.trainer.source import PartitionReader
from services.trainer.steplog import open_log
from shared.contracts.events import UndecodableEvent
from shared.kafka.deadletter import DeadLetterPublisher
from shared.kafka.producer import EventProducer
from shared.kafka.trust import RecordTrust, UntrustedRecord, record_signer
from shared.proto.apprentice.v1 import events_pb2
from shared.retry import Backoff

log = logging.getLogger(__name__)


def run_round(trainer: Trainer, work: tuple[str, Any]) -> RoundResult:
    """Run one round here and, under torchrun, on every other rank too (rank 0 broadcasts the inputs)."""
    kind, payload = broadcast(work) if world_size() > 1 else work
    return trainer.rl_round(payload) if kind == "rl" else trainer.consolidation_round(*payload)


def follow(trainer: Trainer) -> None:
    """Ranks > 0 under torchrun: run each round rank 0 broadcasts, until it says stop."""
    while True:
        kind, payload = broadcast(None)
        if kind == "stop":
            return
        trainer.rl_round(payload) if kind == "rl" else trainer.consolidation_round(*payload)


def follower(settings: TrainerSettings) -> int:
    """Entry of ranks > 0: the same policy as rank 0 (same checkpoint), then `follow`."""
    ckpt = CheckpointStore(settings.resolved_state_dir, settings.checkpoint_keep, cleanup=False).latest()
    trainer = Trainer(settings, init_dir=ckpt.weights_dir if ckpt else None)
    if ckpt is not None:
        trainer.policy.load_training_state(ckpt.training_state)
        trainer.baseline.load(ckpt.state.get("baseline", {}))
    follow(trainer)
    return 0


class Schedule:
    """When to train: RL every `samples` usable rollouts, or after `seconds` with at least `min_samples`;
    consolidation on a new knowledge version, or after `seconds` with `samples` new prompts."""

    def __init__(self, samples: int, seconds: float, min_samples: int, on_knowledge: bool, now: float) -> None:
        self.samples, self.seconds, self.min_samples, self.on_knowledge = samples, seconds, min_samples, on_knowledge
        self.last_rl = self.last_distill = now

    def rl_due(self, ready: int, now: float) -> bool:
        return ready >= self.samples or (ready >= self.min_samples and now - self.last_rl >= self.seconds)

    def distill_due(self, knowledge_changed: bool, new_prompts: int, now: float) -> bool:
        if knowledge_changed and self.on_knowledge:
            return True
        return new_prompts >= self.samples and now - self.last_distill >= self.seconds


class TrainerService:
    def __init__(self, settings: TrainerSettings, weights_stub: Any, *, trainer: Trainer | None = None) -> None:
        s = self.settings = settings
        topics = s.common.topics
        # first: a missing tensorboard/wandb package fails the start before minutes of model loading
        self.experiment = open_log(s.experiment_log.kind, s.resolved_logging_dir,
                                   run_name=s.resolved_run_name,
                                   config=s.model_dump(mode="json", exclude={"common"}))
        self.store = CheckpointStore(s.resolved_state_dir, s.checkpoint_keep)
        ckpt = self.store.latest()
        self.trainer = trainer or Trainer(s, init_dir=ckpt.weights_dir if ckpt else None)
        self.buffer = RolloutBuffer(s.tenant, max_staleness=s.max_staleness, group_wait_s=s.group_wait_s)
        self.trainer.on_step = self._on_step
        self.trainer.staleness_of = lambda r: float(self.buffer.staleness(r.policy_version) or 0)
        self.prompts: deque[dict[str, Any]] = deque(maxlen=s.prompt_pool)
        self.new_prompts = 0
        self.consolidated: dict[str, int] = {}
        self.rounds = 0
        self.knowledge_changed_at = 0.0
        offsets: dict[int, int] = {}
        if ckpt is not None:
            self._restore(ckpt)
            offsets = {int(p): int(o) for p, o in ckpt.state.get("offsets", {}).get(topics.graded, {}).items()}
        self.graded = PartitionReader(s.common.kafka_bootstrap, topics.graded, s.resolved_group_id, offsets)
        self.knowledge_reader = PartitionReader(s.common.kafka_bootstrap, topics.knowledge,
                                                s.resolved_group_id + "-knowledge")
        self.range_start = dict(offsets)
        # Checkpoint announcements and dead letters carry the trainer's signature; graded records are
        # accepted only from their writer (the grader), knowledge snapshots only from the extractor and
        # never older than the snapshot of the same key already taken (shared/kafka/trust.py).
        self.producer = EventProducer(s.common.kafka_bootstrap, client_id=f"trainer-{s.tenant}",
                                      signer=record_signer(s.common, "trainer"))
        self.graded_trust = RecordTrust.from_settings(s.common)
        self.knowledge_trust = RecordTrust.from_settings(s.common, monotonic=True)
        self.dead = DeadLetterPublisher(self.producer, topics.deadletter, source="trainer")
        self.publisher = Publisher(weights_stub, self.producer, topics.checkpoints, model=s.common.model,
                                   tenant=s.tenant, group=s.resolved_group_id)
        self.schedule = Schedule(s.trigger_samples, s.trigger_seconds, s.min_samples, s.trigger_on_knowledge,
                                 time.time())
        self.unpublished: Checkpoint | None = ckpt if ckpt is not None and ckpt.id not in self.store.published() else None
        self._next_publish_try = 0.0
        self._publish_backoff = Backoff(s.publish_retry_s, 2 * s.publish_retry_s)

    # --- state --------------------------------------------------------------------------------------
    def _restore(self, ckpt: Checkpoint) -> None:
        st = ckpt.state
        self.trainer.policy.load_training_state(ckpt.training_state)
        self.buffer.load_state(st.get("buffer", {}))
        self.trainer.baseline.load(st.get("baseline", {}))
        self.prompts.extend(st.get("prompts", []))
        self.new_prompts = int(st.get("new_prompts", 0))
        self.consolidated = {k: int(v) for k, v in st.get("consolidated_knowledge", {}).items()}
        self.rounds = int(st.get("rounds", 0))
        done = self.store.published().get(ckpt.id)
        if done:
            self.buffer.advance(done["version"])
        log.info("resumed from checkpoint", extra={"checkpoint": ckpt.id, "pending": len(self.buffer),
                                                   "lineage": ",".join(self.buffer.lineage)})

    def _state(self, result: RoundResult, prompt_sources: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        graded = self.settings.common.topics.graded
        pos = self.graded.positions()
        if prompt_sources is not None:
            # A consolidation round trains on deployment prompts, which may have been read before earlier
            # rounds: link the version to the graded records those prompts came from.
            spans: dict[int, list[int]] = {}
            for src in prompt_sources:
                if "partition" in src:
                    lo_hi = spans.setdefault(int(src["partition"]), [int(src["offset"]), int(src["offset"])])
                    lo_hi[0], lo_hi[1] = min(lo_hi[0], int(src["offset"])), max(lo_hi[1], int(src["offset"]))
            ranges = [{"topic": graded, "partition": p, "start": lo, "end": hi + 1} for p, (lo, hi) in sorted(spans.items())]
        else:
            ranges = [{"topic": graded, "partition": p, "start": self.range_start.get(p, 0), "end": o}
                      for p, o in sorted(pos.items()) if o > self.range_start.get(p, 0)]
        return {
            "tenant": self.settings.tenant, "model": self.settings.common.model, "algorithm": result.algorithm,
            # the interactions this version learned from: RL's rollouts, or the deployment prompts a
            # consolidation round distilled on (the manifest lists them: services/trainer/publish.py)
            "metrics": result.metrics, "rounds": self.rounds,
            "trained_ids": result.trained_ids or [p["interaction_id"] for p in prompt_sources or []
                                                  if p.get("interaction_id")],
            "steps": self.trainer.policy.steps, "offsets": {graded: {str(p): o for p, o in pos.items()}},
            "data_offsets": ranges, "buffer": self.buffer.to_state(),
            "baseline": self.trainer.baseline.state(), "prompts": list(self.prompts), "new_prompts": self.new_prompts,
            "consolidated_knowledge": self.consolidated, "created_at": time.time(),
            "settings": {"algorithm": self.settings.algorithm, "distill_method": self.settings.distill_method,
                         "finetune": self.settings.finetune.kind, "lr": self.settings.lr, "seed": self.settings.seed},
        }

    # --- intake -------------------------------------------------------------------------------------
    def poll(self, timeout: float | None = None) -> int:
        """Read what is available from both topics; returns the number of graded records read."""
        s = self.settings
        timeout = s.poll_timeout_s if timeout is None else timeout
        for msg in self.knowledge_reader.poll(s.poll_max_records, 0.0):
            try:
                snap = self.knowledge_trust.decode(events_pb2.KnowledgeSnapshot, msg)
            except UndecodableEvent as e:
                self.dead.publish(msg, stage="trainer.knowledge.decode", reason=str(e), error_type=type(e).__name__)
                M.RECORDS.labels("knowledge", "untrusted" if isinstance(e, UntrustedRecord) else "undecodable").inc()
                continue
            self.trainer.knowledge.apply(snap)
            self.knowledge_changed_at = time.time()
            M.RECORDS.labels("knowledge", "read").inc()
        if self._budget_spent():
            return 0
        now = time.time()
        msgs = self.graded.poll(s.poll_max_records, timeout)
        for msg in msgs:
            try:
                g = self.graded_trust.decode(events_pb2.GradedInteraction, msg)
            except UndecodableEvent as e:
                self.dead.publish(msg, stage="trainer.graded.decode", reason=str(e), error_type=type(e).__name__)
                M.RECORDS.labels("graded", "untrusted" if isinstance(e, UntrustedRecord) else "undecodable").inc()
                continue
            outcome = self.buffer.offer(g, now, partition=int(msg.partition() or 0), offset=int(msg.offset() or 0))
            M.RECORDS.labels("graded", outcome).inc()
            if outcome != ACCEPTED:
                M.SKIPPED.labels(outcome).inc()
            if outcome not in (OTHER_TENANT, QUARANTINED, MALFORMED):     # tenant checked by the buffer's `admit`
                self._remember_prompt(g, int(msg.partition() or 0), int(msg.offset() or 0))
        M.BUFFER.set(len(self.buffer))
        return len(msgs)

    def _remember_prompt(self, g: events_pb2.GradedInteraction, partition: int, offset: int) -> None:
        it = g.interaction
        if not it.messages:
            return
        msgs = [{"role": m.role, "content": m.content} for m in it.messages]
        if any(p["messages"] == msgs for p in self.prompts):
            return
        self.prompts.append({"messages": msgs, "task": domain_of(it.task), "interaction_id": it.interaction_id,
                             "partition": partition, "offset": offset})
        self.new_prompts += 1
        M.PROMPTS.set(len(self.prompts))

    def _budget_spent(self) -> bool:
        left = self.trainer.steps_left()
        return left is not None and left <= 0

    # --- rounds -------------------------------------------------------------------------------------
    def maybe_train(self, now: float | None = None) -> RoundResult | None:
        """Run at most one round if one is due (and nothing is waiting to be published)."""
        now = time.time() if now is None else now
        if self.unpublished is not None and self.settings.publish and not self.publish_pending(now):
            return None
        if self._budget_spent():
            return None
        s = self.settings
        ready = self.buffer.ready(now) if s.rl_enabled else []
        if ready and self.schedule.rl_due(len(ready), now):
            ready = self._round_slice(ready)
            for r in ready:
                M.STALENESS.observe(self.buffer.staleness(r.policy_version) or 0)
            result = run_round(self.trainer, ("rl", ready))
            self.buffer.take(ready)
            self.schedule.last_rl = now
            return self._finish(result)
        kv = {k: v for k, v in self.trainer.knowledge.versions().items()}
        sources = [p for p in self.prompts if self.trainer.knowledge.has_items(p["task"])]
        examples = [DistillExample(messages=p["messages"], task=p["task"]) for p in sources]
        changed = any(self.consolidated.get(self.trainer.knowledge.key_for(e.task)) != kv.get(
            self.trainer.knowledge.key_for(e.task)) for e in examples)
        settling = s.trigger_knowledge_quiet_s > 0 and now - self.knowledge_changed_at < s.trigger_knowledge_quiet_s
        if s.distill_enabled and examples and not settling and self.schedule.distill_due(changed, self.new_prompts, now):
            result = run_round(self.trainer, ("oel", (examples, self.trainer.knowledge)))
            self.consolidated = kv
            self.new_prompts = 0
            self.schedule.last_distill = now
            return self._finish(result, sources)
        return None

    def _round_slice(self, ready: list[Any]) -> list[Any]:
        """At most `trigger_samples` rollouts per round (oldest first), never splitting a group, so that a
        backlog becomes several rounds (versions) instead of one giant step."""
        cap = max(self.settings.trigger_samples, self.settings.min_samples)
        chosen: list[Any] = []
        groups: set[str] = set()
        for r in ready:
            if len(chosen) < cap or (r.grouped and r.group_id in groups):
                chosen.append(r)
                if r.grouped:
                    groups.add(r.group_id)
        return chosen

    def _on_step(self, algorithm: str, metrics: dict[str, float]) -> None:
        step = self.trainer.policy.steps
        M.record_step(algorithm, step, metrics)
        self.experiment.log_step(algorithm, step, metrics)

    def _finish(self, result: RoundResult, prompt_sources: list[dict[str, Any]] | None = None) -> RoundResult:
        self.rounds += 1
        M.record_round(result.algorithm, result.metrics)
        self.experiment.log_round(result.algorithm, self.trainer.policy.steps, result.metrics)
        t0 = time.perf_counter()
        ckpt = self.store.write(self.trainer.policy, self._state(result, prompt_sources))
        M.CHECKPOINT_SECONDS.observe(time.perf_counter() - t0)
        self.range_start = self.graded.positions()
        log.info("round done", extra={"algorithm": result.algorithm, "checkpoint": ckpt.id,
                                      **{k: round(v, 5) for k, v in result.metrics.items()}})
        if self.settings.publish:
            self.unpublished = ckpt
            self.publish_pending(time.time(), force=True)
        else:
            self.graded.commit(self.graded.positions())
        return result

    def publish_pending(self, now: float, force: bool = False) -> bool:
        """Publish the newest checkpoint if it is not yet; False while the store/broker is unavailable."""
        ckpt = self.unpublished
        if ckpt is None:
            return True
        if not force and now < self._next_publish_try:
            return False
        parent = self.buffer.lineage[-1]
        try:
            manifest = self.publisher.publish(ckpt, parent)
        except Exception as e:  # noqa: BLE001 - any transport failure is retried; the checkpoint is safe on disk
            M.PUBLISH_FAILURES.inc()
            self._next_publish_try = now + self._publish_backoff.next()
            log.warning("publish failed, will retry: %s", e, extra={"checkpoint": ckpt.id})
            return False
        self._publish_backoff.reset()
        self.store.mark_published(ckpt.id, manifest.version, manifest_digest(manifest))
        self.buffer.advance(manifest.version)
        self.unpublished = None
        M.PUBLISHED.inc()
        self.graded.commit({int(p): int(o) for p, o in ckpt.state["offsets"].get(
            self.settings.common.topics.graded, {}).items()})
        log.info("version published", extra={"version": manifest.version, "checkpoint": ckpt.id,
                                              "parent": parent, "tenant": self.settings.tenant})
        return True

    # --- loop ---------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.poll()
            self.maybe_train()

    def close(self) -> None:
        if world_size() > 1:
            broadcast(("stop", None))             # release the follower ranks
        self.graded.close()
        self.knowledge_reader.close()
        self.producer.close()
        self.experiment.close()
