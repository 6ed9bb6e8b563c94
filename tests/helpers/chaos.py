"""The chaos run: load through a private local stack while every service is kill -9'd in turn, the broker is
killed and restarted, and weights are swapped; then the topics must prove that nothing was lost or done
twice. `run_chaos(ChaosConfig(...))` returns the figures; `load/chaos.py` is its command line and
`tests/integration/test_loop_chaos.py` its CI-sized run.

What it does, in order (load runs throughout: gRPC Generate + Feedback through the inference service from
several tenants with the task file's task tag, retrying failed calls as a product backend would):
1. a private broker on free ports under the run folder (the shared one at 9092 is never touched), the
   five services as supervised processes (`tools.stack.stack.LocalStack`), tiny model;
2. kill -9 of each service in `kill` order; the supervisor restarts it; the next one goes once the
   previous answers again and the load ran `dwell_s` seconds (`kill_together`: all at the same moment);
3. the broker: kill -9 (default; `broker_fault="stop"` = SIGTERM, a clean shutdown), down `broker_down_s`
   seconds, started again on the same port and data;
4. weight swaps under load: an operator version (a copy of the base weights) is uploaded and promoted
   for every tenant, then rolled back to base; and the trainer (RL on one tenant, small rounds)
   publishes versions that the weights service gates and auto-promotes for that tenant, waited for
   until `min_trainer_versions` are promoted;
5. load stops, the pipeline drains, and `chaos_invariants.py` checks the topics, the trainer's
   checkpoints and the clients' call records.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from load.loadgen import LoadGenerator, Stats
from tests.helpers.chaos_faults import (
    PromotionFault,
    broker_outage,
    kill_group,
    leader_outage,
    operator_version,
    promotion_outage,
    rollback_to_base,
    rolling_restart,
    say,
    stop_broker,
    upload_operator_version,
)
from tests.helpers.chaos_invariants import (
    Figure,
    Window,
    check_feedback,
    check_graded,
    check_interactions,
    check_requests,
    check_training,
    print_table,
    swap_windows,
)
from tests.helpers.kafka import private_broker, private_cluster, read_to_end
from tests.helpers.waiting import wait_for
from tools.broker.cluster import LocalCluster
from tools.broker.local_broker import LocalBroker
from tools.stack.stack import LocalStack
from tools.stack.supervisor import SERVICES, service_of

KILL_ORDER = ("inference", "grader", "extractor", "trainer", "weights")

GRADER_CONFIG = """\
# Chaos runs: every answer gets KPI feedback (revision 1 at once) and some a later thumbs (revision 2).
version: chaos-1
tasks:
  - tenant: "*"
    task: "*"
    feedback_window_s: {window}
    emit_when: any_feedback
    graders:
      - {{name: resolved, type: kpi, kpi: resolved, map: {{1: 1.0, 0: 0.0}}, weight: 1.0, success: true}}
      - {{name: thumbs, type: feedback, kind: thumbs, weight: 1.0}}
detectors:
  min_samples: 1000
"""


# Small eval sets for the weights gate: it runs for real on every trainer version, in seconds instead of
# the default sets' ~20 s per version on 2 loaded cores (the gate is not what a chaos run measures).
EVAL_HELDOUT = """\
name: chaos-heldout
graders: [{name: fact, type: contains, reference_key: answer, ignore_case: true}]
items:
  - {prompt: "Which form do I need to return something?", reference: {answer: "RF-7734"}}
  - {prompt: "What extension reaches support?", reference: {answer: "4410"}}
  - {prompt: "How long is the warranty on tents?", reference: {answer: "18-month"}}
"""
EVAL_OOD = """\
name: chaos-ood
items:
  - {prompt: "What is the capital of France?", answer: "The capital of France is Paris.",
     check: {type: contains, any_of: [Paris]}}
  - {prompt: "How many days are in a week?", answer: "There are seven days in a week."}
"""


@dataclass
class ChaosConfig:
    run_dir: Path
    """Stack state, service logs and the private broker's data."""
    model: str = "tiny-random"
    task: str = "support_desk"
    """Task file the prompts come from (its task tag is on every request)."""
    tenants: tuple[str, ...] = ("acme", "globex", "initech")
    trainer_tenant: str = "acme"
    """The one tenant the trainer trains (its versions swap that tenant only)."""
    concurrency: int = 3
    qps: float = 4.0
    """Open-loop request rate: enough traffic in every window, little enough for 2 cores."""
    max_new_tokens: int = 8
    thumbs_rate: float = 0.3
    """Share of answers that get a late thumbs after their KPI feedback (graded revision 2)."""
    feedback_delay_s: float = 1.0
    retry_s: float = 90.0
    """Clients retry a failed call this long (through a restart of the inference process)."""
    kill: tuple[str, ...] = KILL_ORDER
    kill_together: bool = False
    """kill -9 every service of `kill` at the same moment (one restart wave, for CI) instead of in turn."""
    broker_fault: str = "kill"
    """kill (SIGKILL) | stop (SIGTERM, clean) | none."""
    broker_down_s: float = 4.0
    warmup_s: float = 5.0
    dwell_s: float = 3.0
    """Load keeps running this long after each fault healed, before the next one."""
    trigger_samples: int = 8
    """Trainer RL round size: small, so several versions (and swaps) happen within the run."""
    min_trainer_versions: int = 1
    """Trainer versions that must be promoted under load (waited for up to `versions_timeout_s`)."""
    operator_swap: bool = True
    small_eval_sets: bool = True
    """The weights gate evaluates each version on 3 held-out + 2 OOD items (False: its default sets)."""
    start_timeout_s: float = 300.0
    restart_timeout_s: float = 120.0
    versions_timeout_s: float = 120.0
    drain_timeout_s: float = 120.0
    brokers: int = 1
    """1: a private single broker (killed and restarted: an outage). 3: a private replicated cluster
    (tools/broker/cluster.py): the node leading the most partitions of interactions and graded is killed
    (`broker_fault` kill) and restarted, then all three restart in turn; the cluster keeps serving throughout."""
    strict_delivery: bool = False
    """Count duplicate deliveries (same event id twice) as failures too, not only duplicate effects."""
    torch_threads: int = 1
    """Per service: five processes share 2 cores."""
    replicas: dict[str, int] = field(default_factory=dict)
    """Service -> how many run (`LocalStack.replicas`: inference pods, grader workers, weights replicas);
    `kill` names the one killed (`inference` is pod 0, `inference-1` pod 1)."""
    trainer_ranks: int = 1
    """The trainer as this many torchrun ranks (its kill takes the whole pod: agent and ranks)."""
    promotion_kill: bool = False
    """The operator's version is promoted through the gate (not forced), and the weights replica evaluating
    it is kill -9'd while the call waits; the caller's retry must promote it on another replica, once."""


@dataclass
class ChaosResult:
    figures: list[Figure]
    faults: list[Window]
    swaps: list[Window]
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(f.ok is not False for f in self.figures)

    @property
    def failed(self) -> list[Figure]:
        return [f for f in self.figures if f.ok is False]

    def table(self) -> str:
        return print_table(self.figures)

    def value(self, name: str) -> Any:
        """The value of the figure named `name`, or of the one figure whose name starts with it."""
        exact = [f for f in self.figures if f.name == name]
        matches = exact or [f for f in self.figures if f.name.startswith(name)]
        assert len(matches) == 1, f"{len(matches)} figures start with {name!r}"
        return matches[0].value


# --- the stack's configuration for a chaos run -----------------------------------------------------
def service_env(cfg: ChaosConfig) -> dict[str, dict[str, str]]:
    """Settings that make one short run exercise everything: every answer graded at once, RL-only
    training of one tenant in small rounds with every checkpoint kept (their state.json is the training
    record), every version kept in the store, auto-promotion, light extraction."""
    grader_cfg = cfg.run_dir / "grader-chaos.yaml"
    grader_cfg.parent.mkdir(parents=True, exist_ok=True)
    grader_cfg.write_text(GRADER_CONFIG.format(window=int(cfg.drain_timeout_s + 600)))
    threads = {"APPRENTICE_TORCH_THREADS": str(cfg.torch_threads)} if cfg.torch_threads else {}
    weights = {"APPRENTICE_WEIGHTS_KEEP_LAST": "100000", "APPRENTICE_WEIGHTS_POLICY": "auto", **threads}
    if cfg.small_eval_sets:
        (cfg.run_dir / "eval-heldout.yaml").write_text(EVAL_HELDOUT)
        (cfg.run_dir / "eval-ood.yaml").write_text(EVAL_OOD)
        weights.update({"APPRENTICE_WEIGHTS_EVAL_SET": str(cfg.run_dir / "eval-heldout.yaml"),
                        "APPRENTICE_WEIGHTS_OOD_SET": str(cfg.run_dir / "eval-ood.yaml"),
                        "APPRENTICE_WEIGHTS_EVAL_MAX_NEW_TOKENS": "16"})
    return {
        "inference": {**threads},
        "grader": {"APPRENTICE_GRADER_CONFIG_PATH": str(grader_cfg), **threads},
        "extractor": {"APPRENTICE_EXTRACTOR_SESSION_GAP_S": "2", "APPRENTICE_EXTRACTOR_MAX_NEW_TOKENS": "16",
                      "APPRENTICE_EXTRACTOR_RATE_LIMIT_PER_S": "0.5", **threads},
        "trainer": {"APPRENTICE_TRAINER_TENANT": cfg.trainer_tenant, "APPRENTICE_TRAINER_RL_ENABLED": "true",
                    "APPRENTICE_TRAINER_DISTILL_ENABLED": "false",
                    "APPRENTICE_TRAINER_TRIGGER_SAMPLES": str(cfg.trigger_samples),
                    "APPRENTICE_TRAINER_BATCH_SIZE": str(cfg.trigger_samples),
                    "APPRENTICE_TRAINER_MICRO_BATCH_SIZE": str(cfg.trigger_samples),
                    # every checkpoint stays on disk: its state.json names the interactions it trained
                    "APPRENTICE_TRAINER_CHECKPOINT_KEEP": "100000", **threads},
        "weights": weights,
    }


# --- the run -----------------------------------------------------------------------------------------
class Chaos:
    def __init__(self, cfg: ChaosConfig) -> None:
        unknown = {name for name in cfg.kill if service_of(name) not in SERVICES}
        if unknown:
            raise ValueError(f"--kill names unknown services {sorted(unknown)}; choose from {', '.join(SERVICES)}")
        if cfg.broker_fault not in ("kill", "stop", "none"):
            raise ValueError(f"broker_fault must be kill, stop or none; got {cfg.broker_fault!r}")
        if cfg.trainer_tenant not in cfg.tenants:
            raise ValueError(f"the trainer's tenant {cfg.trainer_tenant!r} must be one of the load's tenants")
        self.cfg = cfg
        self.broker: LocalBroker | LocalCluster = (private_cluster(cfg.run_dir / "broker", cfg.brokers)
                                                   if cfg.brokers > 1 else private_broker(cfg.run_dir / "broker"))
        self.stack = LocalStack(cfg.run_dir / "stack", cfg.model, service_env=service_env(cfg), broker=self.broker,
                                replicas=cfg.replicas, trainer_ranks=cfg.trainer_ranks)
        self.promotion: PromotionFault | None = None
        self.faults: list[Window] = []
        self.recovered: dict[str, bool] = {}       # fault target -> answered again in time
        self.seconds: dict[str, float] = {}

    def run(self) -> ChaosResult:
        cfg, stack = self.cfg, self.stack
        t_start = time.monotonic()
        say(f"starting a private broker at {self.broker.bootstrap} and the stack ({cfg.model}) in {cfg.run_dir}")
        try:
            stack.start()
            health = stack.wait_healthy(cfg.start_timeout_s)
            if not all(health.values()):
                raise RuntimeError(f"services did not become healthy: {health}; logs in {stack.run_dir / 'logs'}")
            self.seconds["stack_start"] = time.monotonic() - t_start
            say(f"stack healthy after {self.seconds['stack_start']:.0f}s; load starts")
            from tools.demo.watch import TopicWatcher

            self.watcher = TopicWatcher(self.broker.bootstrap, stack.topics)
            self.gen = LoadGenerator(stack.inference_target, cfg.task, list(cfg.tenants),
                                     max_new_tokens=cfg.max_new_tokens, feedback_rate=1.0,
                                     feedback_delay_s=cfg.feedback_delay_s, timeout_s=30.0, retry_s=cfg.retry_s,
                                     thumbs_rate=cfg.thumbs_rate, seed=7, common=stack.client_common)
            stats: list[Stats] = []
            load = threading.Thread(target=lambda: stats.append(self.gen.run(
                duration_s=3600, concurrency=cfg.concurrency, qps=cfg.qps, max_requests=10**9,
                max_in_flight=cfg.concurrency)), daemon=True)
            t_load = time.monotonic()
            load.start()
            self._faults_under_load()
            self.gen.stop()
            load.join(cfg.retry_s + 120)
            self.seconds["load"] = time.monotonic() - t_load
            if not stats:
                raise RuntimeError("the load generator did not finish")
            t_drain = time.monotonic()
            self._drain(stats[0])
            self._settle_trainer()
            self.seconds["drain"] = time.monotonic() - t_drain
            result = self._check(stats[0])
            self.seconds["total"] = time.monotonic() - t_start
            result.seconds = dict(self.seconds)
            return result
        finally:
            if hasattr(self, "gen"):
                self.gen.stop()
            for closer in ("gen", "watcher"):
                if hasattr(self, closer):
                    with contextlib.suppress(Exception):
                        getattr(self, closer).close()
            stack.stop(grace=5.0)      # the figures are taken: no need to wait for graceful drains
            if isinstance(self.broker, LocalCluster):
                self.broker.stop()
            else:
                stop_broker(self.broker)

    def _faults_under_load(self) -> None:
        cfg = self.cfg
        time.sleep(cfg.warmup_s)          # load alone first: every window below needs traffic before it
        groups = [cfg.kill] if cfg.kill_together else [(name,) for name in cfg.kill]
        for group in groups:
            if not group:
                continue
            if "trainer" in group:
                self._wait_trainer_checkpoint()
            for name, (window, back) in kill_group(self.stack, group, cfg.restart_timeout_s).items():
                self.faults.append(window)
                self.recovered[name] = back
            if not all(self.recovered[n] for n in group):
                return            # a service that does not come back fails the run; go check what we have
            time.sleep(cfg.dwell_s)      # load on the healed stack before the next fault (the run's shape)
        if isinstance(self.broker, LocalCluster):
            self._cluster_faults()
        elif cfg.broker_fault != "none":
            self.faults.append(broker_outage(self.broker, cfg.broker_fault, cfg.broker_down_s))
            t0 = time.monotonic()
            health = self.stack.wait_healthy(cfg.restart_timeout_s)
            say(f"services healthy {time.monotonic() - t0:.1f}s after the broker answered: {health}")
            self.recovered["broker"] = all(health.values())
            if not all(health.values()):
                say(f"services not healthy {cfg.restart_timeout_s:.0f}s after the broker came back: {health}")
                return
            time.sleep(cfg.dwell_s)      # load on the healed stack before the next fault
        if cfg.operator_swap and cfg.promotion_kill:
            version = upload_operator_version(self.stack, cfg.model, self.stack.run_dir / "operator-version")
            if version is None:
                raise RuntimeError(f"no local weights folder for {cfg.model}: no promotion to kill the weights in")
            self.promotion = promotion_outage(self.stack, cfg.model, version, cfg.restart_timeout_s)
            self.faults.append(self.promotion.window)
            self.recovered[self.promotion.window.target] = self.promotion.restarted
            time.sleep(cfg.dwell_s + 2)  # load served by the promoted version: the swap window
            rollback_to_base(self.stack, cfg.model)
            say("operator slot rolled back to base")
            time.sleep(cfg.dwell_s + 2)
        elif cfg.operator_swap:
            version = operator_version(self.stack, cfg.model, self.stack.run_dir / "operator-version")
            if version is None:
                say(f"no local weights folder for {cfg.model}: operator swap skipped")
            else:
                say(f"operator version {version} uploaded and promoted for every tenant")
                time.sleep(cfg.dwell_s + 2)  # load served by the swapped version: the swap window
                rollback_to_base(self.stack, cfg.model)
                say("operator slot rolled back to base")
                time.sleep(cfg.dwell_s + 2)  # load after the rollback, inside its window
        self._wait_trainer_versions()
        time.sleep(cfg.dwell_s)          # load on the trainer's versions before it stops

    def _cluster_faults(self) -> None:
        """The busiest leader killed and restarted, then a rolling restart of every node; the services are
        never without a broker, so they must stay healthy and no call may fail."""
        assert isinstance(self.broker, LocalCluster)
        cfg, t = self.cfg, self.stack.topics
        if cfg.broker_fault == "kill":
            self.faults.append(leader_outage(self.broker, [t.interactions, t.graded], cfg.broker_down_s))
            self.recovered["broker"] = all(self.stack.wait_healthy(cfg.restart_timeout_s).values())
            time.sleep(cfg.dwell_s)
        self.faults.append(rolling_restart(self.broker))
        self.recovered["rolling"] = all(self.stack.wait_healthy(cfg.restart_timeout_s).values())
        time.sleep(cfg.dwell_s)

    def _wait_trainer_checkpoint(self) -> None:
        """Until the trainer wrote a checkpoint: killed before its first one, a restarted trainer just
        reads from the beginning; killed after it, the restart must resume from the checkpoint's offsets,
        buffer and trained ids (the path where a sample could be trained twice or lost)."""
        latest = self.stack.run_dir / "trainer" / self.cfg.trainer_tenant / "LATEST"
        with contextlib.suppress(AssertionError):  # none yet: the kill then tests the other path
            wait_for(latest.exists, what="the trainer's first checkpoint", stall_s=self.cfg.versions_timeout_s,
                     every=0.5)
        say(f"trainer checkpoint before its kill: {latest.read_text().strip() if latest.exists() else 'none yet'}")

    def _wait_trainer_versions(self) -> None:
        cfg = self.cfg

        def promoted() -> set[str]:
            return {u.version for u in self.watcher.snapshot().updates if u.tenant == cfg.trainer_tenant}

        try:
            wait_for(lambda: len(promoted()) >= cfg.min_trainer_versions, what="trainer versions promoted",
                     stall_s=cfg.versions_timeout_s, every=1.0)
            say(f"trainer versions promoted for {cfg.trainer_tenant}: {sorted(promoted())}")
        except AssertionError:      # reported by the figures (check_training)
            say(f"only {len(promoted())} trainer version(s) promoted within {cfg.versions_timeout_s:.0f}s")

    def _drain(self, stats: Stats) -> None:
        """Until every received answer is graded with all its acknowledged feedback, for as long as the
        pipeline keeps grading (it stops after `drain_timeout_s` without one more answer done)."""

        def waiting() -> list[Any]:
            graded = self.watcher.snapshot().graded
            return [s for i, s in stats.served.items()
                    if i not in graded or set(s.feedback_ids) - {f.envelope.event_id for f in graded[i].feedback}]

        with contextlib.suppress(AssertionError):  # what is left is reported by the figures
            wait_for(lambda: not waiting(), what="every answer graded", stall_s=self.cfg.drain_timeout_s,
                     progress=lambda: len(waiting()), every=1.0)
        left = len(waiting())
        say(f"drained: {len(stats.served) - left}/{len(stats.served)} answers graded with all their feedback")

    def _settle_trainer(self, quiet_s: float = 5.0, timeout: float = 60.0) -> None:
        """Until the trainer's newest checkpoint is published and nothing changed for `quiet_s`."""
        d = self.stack.run_dir / "trainer" / self.cfg.trainer_tenant
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            latest = (d / "LATEST").read_text().strip() if (d / "LATEST").exists() else ""
            published = json.loads((d / "published.json").read_text()) if (d / "published.json").exists() else {}
            now = (latest, len(published))
            if now != last:
                last, since = now, time.monotonic()
            elif (not latest or latest in published) and time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.5)         # poll interval of a quiet-period check (wait_for has no "unchanged for")

    def _check(self, stats: Stats) -> ChaosResult:

        from shared.contracts.events import decode
        from shared.proto.apprentice.v1 import events_pb2, weights_pb2, weights_pb2_grpc

        cfg, t = self.cfg, self.stack.topics
        names = {"interactions": t.interactions, "feedback": t.feedback, "graded": t.graded,
                 "updates": t.model_updates, "checkpoints": t.checkpoints}
        with ThreadPoolExecutor(len(names)) as pool:
            futures = {name: pool.submit(read_to_end, self.broker.bootstrap, topic) for name, topic in names.items()}
            records = {name: f.result() for name, f in futures.items()}
        with self.stack.channel(self.stack.weights_target) as ch:
            manifests = list(weights_pb2_grpc.WeightsStub(ch).List(
                weights_pb2.ListVersionsRequest(model=cfg.model), timeout=30).versions)
        swaps = swap_windows(records["updates"], stats.attempts, cfg.tenants)
        health = self.stack.health()
        sup = self.stack.supervisor
        figures = [
            *check_interactions(stats.served, records["interactions"], strict_delivery=cfg.strict_delivery),
            *check_feedback(stats.served, records["feedback"], strict_delivery=cfg.strict_delivery),
            *check_graded(stats.served, records["graded"], strict_delivery=cfg.strict_delivery),
            *check_training(cfg.trainer_tenant, self.stack.run_dir / "trainer" / cfg.trainer_tenant,
                            records["interactions"], records["checkpoints"], manifests,
                            min_versions=cfg.min_trainer_versions),
            *check_requests(stats.attempts, stats.failed, self.faults, swaps, min_swaps=1),
        ]
        for name in cfg.kill:
            c = sup.child(name)
            w = next((f for f in self.faults if f.target == name), None)
            back = self.recovered.get(name, False)
            figures.append(Figure("faults", f"{name}: kill -9, restarted by the supervisor, healthy after (s)",
                                  round(w.end - w.start, 1) if w and back else "never", back and c.restarts >= 1))
        if cfg.broker_fault != "none":
            w = next((f for f in self.faults if f.kind == "broker"), None)
            back = self.recovered.get("broker", False)
            what = (f"broker: kill -9 of {w.target if w else 'the busiest leader'}, back and in sync after (s)"
                    if cfg.brokers > 1 else
                    f"broker: {'kill -9' if cfg.broker_fault == 'kill' else 'clean stop'}, answering again after (s)")
            figures.append(Figure("faults", what, round(w.end - w.start, 1) if w and back else "never", back))
        if cfg.brokers > 1:
            w = next((f for f in self.faults if f.kind == "rolling"), None)
            back = self.recovered.get("rolling", False)
            figures.append(Figure("faults", f"rolling restart of {cfg.brokers} brokers, each in sync, took (s)",
                                  round(w.end - w.start, 1) if w and back else "never", back))
        if self.promotion is not None:
            p = self.promotion
            updates = [decode(events_pb2.ModelUpdate, r.value()) for r in records["updates"]]
            orders = {u.envelope.event_id for u in updates
                      if u.version == p.version and u.action == events_pb2.UPDATE_ACTION_PROMOTE}
            figures += [
                Figure("faults", f"{p.window.target}: kill -9 while its gate evaluated a promotion",
                       "in flight" if p.in_flight else "missed", p.in_flight),
                Figure("faults", "promotion completed by the caller's retry on another replica after (s)",
                       round(p.promote_seconds, 1) if p.promoted else "never", p.promoted),
                Figure("faults", "promote orders sent for that version (distinct ids)", len(orders), len(orders) == 1),
                Figure("faults", f"{p.window.target}: restarted by the supervisor, healthy after (s)",
                       round(p.window.end - p.window.start, 1) if p.restarted else "never", p.restarted),
            ]
        figures.append(Figure("faults", "services healthy at the end", sum(health.values()), all(health.values())))
        return ChaosResult(figures, list(self.faults), swaps)


def run_chaos(cfg: ChaosConfig) -> ChaosResult:
    return Chaos(cfg).run()
