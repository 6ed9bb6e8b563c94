"""Task + rounds --> a learning curve: the closed loop through all five services, with simulated users.

Per round (as in OEL): deploy (the served policy answers simulated users; the product backend reports the
KPI and, when wrong, a human correction) --> the grader turns that into rewards --> the extractor turns
trajectories into knowledge --> the trainer consolidates (context distillation) and/or runs GRPO -->
the weights service gates, promotes and streams the new version --> inference hot-swaps it --> the
held-out questions (never asked during deployment) and an out-of-distribution set are evaluated through
the Inference service without capture.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from shared.kafka.producer import EventProducer
from shared.kafka.trust import record_signer
from shared.progress import progress_enabled
from shared.proto.apprentice.v1 import (
    events_pb2,
    knowledge_pb2,
    knowledge_pb2_grpc,
    weights_pb2,
    weights_pb2_grpc,
)
from shared.settings import CommonSettings
from tools.demo.agent_users import AgentUsers
from tools.demo.evaluation import Evaluator
from tools.demo.report import StepsLog, hack_notes, plot, write_report
from tools.demo.reward_hack import (
    hack_replies,
    planted_summary,
    train_planted,
    trained_lists,
    upload_planted,
    verify,
)
from tools.demo.run_dirs import new_run_dir, prune_runs
from tools.demo.simulated_users import SimulatedUsers
from tools.demo.train_progress import TrainingProgress
from tools.demo.watch import TopicWatcher
from tools.stack.stack import LocalStack
from tools.tasks.config import write_task_config
from tools.tasks.task import Task, load_task

# The GRPO demo's update, by the sweep (docs/demo.md, "the sweep"): LoRA r16 (alpha 32) at 5e-4 after a
# 5-step warm-up, KL beta 0.1, two PPO epochs over each round's rollouts; 90 users x 4 answers per round, 4
# rounds; the routing task caps replies at 16 tokens. Full fine-tuning at 2e-5 (runs A, C) and LoRA at 2e-4
# (B, D) barely moved the policy; LoRA at 1e-3 with KL beta 0.04 moved it too far: F collapsed onto one reply
# (now flagged by the report and quarantined by the grader) and in G the gate refused every candidate for
# drift in the general answers. Run H (this setting) gained +22 points (95% CI +15 to +29), OOD unchanged.
RL_LOSS = {"APPRENTICE_TRAINER_KL_BETA": "0.1", "APPRENTICE_TRAINER_PPO_EPOCHS": "2"}
"""The knobs of the GRPO loss alone, which `--algo both` takes too: there both learners share one policy and
one optimizer, so the update (kind, rate) stays distillation's (full fine-tuning at 5e-5)."""
RL_UPDATE = {"APPRENTICE_TRAINER_FINETUNE__KIND": "lora", "APPRENTICE_TRAINER_FINETUNE__RANK": "16",
             "APPRENTICE_TRAINER_FINETUNE__ALPHA": "32", "APPRENTICE_TRAINER_LR": "5e-4",
             "APPRENTICE_TRAINER_WARMUP_STEPS": "5", **RL_LOSS}
RL_USERS, RL_ROUNDS = 90, 4
DRILL = {"APPRENTICE_TRAINER_DISTILL_STEPS": "40", "APPRENTICE_TRAINER_DISTILL_BATCH": "16",
         "APPRENTICE_TRAINER_TEACHER_SAMPLES": "1", "APPRENTICE_TRAINER_DISTILL_PARAPHRASES": "2",
         "APPRENTICE_TRAINER_DISTILL_REPLAY_SHARE": "0.25"}
"""The consolidation round of the demo (docs/consolidation.md, load/consolidation_probe.py): 40 steps of 16
short drill rows, one teacher answer per question (a question none holds the terms of takes the item's text),
two paraphrases per question, a quarter of each batch replaying general prompts."""


@dataclass
class DemoBudget:
    rounds: int
    users_per_round: int
    eval_samples: int          # sampled answers per held-out question (T=0.7), besides the greedy one
    max_new_tokens: int
    round_timeout_s: float     # waiting for grade -> extract -> train -> gate -> promote
    trainer_env: dict[str, str]
    extractor_env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def full(rounds: int, algo: str = "oel") -> DemoBudget:
        # GRPO: greedy + 3 samples of each held-out message (55 on the routing task: 220 answers, which
        # see a 7-point change at 80% power at its 7% base rate under the 16-token cap, 11 at 24% with 48
        # tokens; 1.4 minutes on the CPU pod with the cap); the evaluation runs every round, and more
        # samples would take the time the 60-minute RL run needs for training steps
        return DemoBudget(rounds=rounds, users_per_round=RL_USERS if algo == "grpo" else 60,
                          eval_samples=3 if algo == "grpo" else 4, max_new_tokens=48,
                          round_timeout_s=1500, trainer_env={**DRILL,
                                                             **(RL_UPDATE if algo == "grpo" else
                                                                RL_LOSS if algo == "both" else {})},
                          # knowledge from the human corrections only: SmolLM2 writes poor rules (docs/oel-probe.md)
                          # and the CPU cannot afford its prompts: one extraction (638 prompt + 192 new tokens,
                          # one torch thread, shared 2-core machine, 2026-12-01) took 67 s, a batch of 4 161 s,
                          # so a round's 60 trajectories would hold the one inference pod ~40 minutes. (The
                          # extractor no longer loses its Kafka group while it waits: shared/kafka/busy.py.)
                          extractor_env={"APPRENTICE_EXTRACTOR_LLM_ITEMS": "false"})

    @staticmethod
    def quick(rounds: int) -> DemoBudget:
        return DemoBudget(rounds=rounds, users_per_round=10, eval_samples=0, max_new_tokens=24,
                          round_timeout_s=900, trainer_env={"APPRENTICE_TRAINER_DISTILL_STEPS": "1",
                                                            "APPRENTICE_TRAINER_DISTILL_BATCH": "4",
                                                            "APPRENTICE_TRAINER_DISTILL_PARAPHRASES": "1",
                                                            # --quick runs a random model in tests: its samples
                                                            # loop and never end, and the target filters would
                                                            # leave the plumbing nothing to carry
                                                            "APPRENTICE_TRAINER_SFT_MAX_REPETITION": "1.0",
                                                            "APPRENTICE_TRAINER_SFT_FINISHED_ONLY": "false"})


class Progress:
    """One status line, rewritten in place on a terminal; plain lines otherwise (logs, CI)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.last = ""

    def __call__(self, msg: str, done: bool = False) -> None:
        if msg == self.last and not self.tty:
            return  # logs get a line per change, not per poll
        self.last = msg
        line = f"[{time.monotonic() - self.t0:6.0f}s] {msg}"
        if self.tty and not done:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(("\r\033[K" if self.tty else "") + line + "\n")
        sys.stderr.flush()


class Demo:
    def __init__(self, task: Task, *, model: str, budget: DemoBudget, algo: str, report: Path, plot_path: Path,
                 run_dir: Path, seed: int = 0, task_source: str | None = None, plant_hack: bool = False,
                 facts_per_round: int = 0) -> None:
        if plant_hack and task.tool is None:
            raise ValueError(f"--plant-hack needs a task with a tool (its loophole); {task.name!r} has none")
        self.task, self.model, self.budget, self.algo = task, model, budget, algo
        # the continual mode: round k's users ask only about the k-th group of `facts_per_round` new facts
        # (every fact from round 1 when 0); the report's forgetting matrix follows each group afterwards
        self.cohorts = ({f.id: i // facts_per_round + 1 for i, f in enumerate(task.facts)} if facts_per_round > 0
                        else {})
        self.plant_hack = plant_hack
        self.exchanges: list[Any] = []          # every deployment answer of the run (the hack check reads them)
        self.served_seen: set[str] = set()      # every version a pod was seen serving to the task's tenant
        self.planted: dict[str, Any] | None = None
        self.trained_cache: dict[str, list[str]] = {}  # version -> its trained interactions (immutable)
        self.task_source = task_source or task.name   # where the task came from (the report's meta)
        self.report_path, self.plot_path, self.run_dir, self.seed = report, plot_path, run_dir, seed
        self.progress = Progress()
        self.steps_log = StepsLog(run_dir / "trainer_steps" / "steps.jsonl")
        # announced in the default home: `apprentice status`, `weights list`, `tail`, ... find the demo's
        # stack during the run without a variable (unless `apprentice up` has a stack recorded there)
        self.service_env = self._service_env()
        self.stack = LocalStack(run_dir, model, service_env=self.service_env, tenants=(self.task.tenant,),
                                announce_in=CommonSettings().home)
        self.rounds: list[dict[str, Any]] = []
        # the simulated operator reviews knowledge all the time, as a person on call would: item id -> (when
        # approved, the fact it states, the questions it came from)
        self.approved_at: dict[str, tuple[float, str, tuple[str, ...]]] = {}
        self._review_lock = threading.Lock()
        self._reviewing = threading.Event()
        self._reported_latency: set[str] = set()

    # --- configuration of the services for this task -------------------------------------------------
    def _service_env(self) -> dict[str, dict[str, str]]:

        # the task's tenant, task and KPI configure grader routing, gate eval sets, trainer tenant, verifier
        per_task = write_task_config(self.task, self.run_dir / "config")
        rl = self.algo in ("grpo", "both")
        distill = self.algo in ("oel", "both")
        trainer = {
            **per_task["trainer"],
            "APPRENTICE_TRAINER_RL_ENABLED": str(rl).lower(),
            "APPRENTICE_TRAINER_DISTILL_ENABLED": str(distill).lower(),
            # RL: train once three quarters of a round's group samples are usable (quarantined ones never
            # arrive, so waiting for all of them would wait for the next round's traffic)
            "APPRENTICE_TRAINER_TRIGGER_SAMPLES": str(self.budget.users_per_round * 3 if rl else self.budget.users_per_round),
            "APPRENTICE_TRAINER_TRIGGER_ON_KNOWLEDGE": "true",
            "APPRENTICE_TRAINER_TRIGGER_KNOWLEDGE_QUIET_S": "15",
            # drills per approved item (services/trainer/drill.py; docs/consolidation.md has the sweep that chose
            # it: sft_filtered's few kept samples moved weights-only success by +4 to +10 points)
            "APPRENTICE_TRAINER_DISTILL_METHOD": "sft_items",
            # full fine-tuning at 5e-5 (docs/consolidation.md: the sweep's LoRA rows)
            "APPRENTICE_TRAINER_FINETUNE__KIND": "full",
            "APPRENTICE_TRAINER_LR": "5e-5",
            "APPRENTICE_TRAINER_DISTILL_TEMPERATURE": "0.7",
            "APPRENTICE_TRAINER_SEED": str(self.seed),
            # RL alone: a smaller step and GRPO's KL to the base model (DeepSeekMath's beta 0.04). At the
            # distillation settings (5e-5, no KL) one round of 14 GRPO steps drifted 0.24 nats/token from the
            # behaviour policy and flipped an out-of-distribution answer: the gate refused it.
            **({"APPRENTICE_TRAINER_LR": "2e-5", "APPRENTICE_TRAINER_KL_BETA": "0.04"} if self.algo == "grpo" else {}),
            # every optimizer step's metrics (reward, KL, clipping, staleness, IS weights) as JSON lines, which
            # each round's report entry takes up (`train_steps`)
            "APPRENTICE_TRAINER_EXPERIMENT_LOG__KIND": "jsonl",
            "APPRENTICE_TRAINER_EXPERIMENT_LOG__DIR": str(self.steps_log.path.parent),
            **self.budget.trainer_env,
        }
        # no auto-approval: the corrections arrive with the tenant's backend key (the end users' channel), so
        # they wait as proposals until the reviewer step (`_review_knowledge`) approves them as the operator
        extractor = {"APPRENTICE_EXTRACTOR_SESSION_GAP_S": "2",
                     **self.budget.extractor_env}
        # one tenant: it may fill the engine without ever being preempted (the default quarter share applies
        # while another tenant has work, and a lone tenant borrows the rest; services/inference/scheduler.py)
        inference = {"APPRENTICE_INFERENCE_TENANT_BATCH_SHARE": "1.0"}
        services = {"trainer": trainer, "extractor": {**per_task["extractor"], **extractor},
                    "grader": dict(per_task["grader"]), "weights": dict(per_task["weights"]),
                    "inference": {**per_task["inference"], **inference}}
        # One intra-op thread per service: inference, trainer and the gate run at the same time on a
        # 2-core machine, and torch's default (a thread per core in each process) oversubscribes it; the
        # OpenMP barriers then stall (measured: SmolLM2 inference fell to ~4 tokens/s during training).
        for env in services.values():
            env.setdefault("APPRENTICE_TORCH_THREADS", "1")
        return services

    # --- the loop ------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        p = self.progress
        p(f"starting the stack ({self.model}) in {self.run_dir}")
        self.stack.start()
        if self.stack.creds is not None:
            p(f"dashboard: {self.stack.dashboard_url} (sign in with the operator key in "
              f"{self.stack.creds.operator_token})", done=True)
        try:
            health = self.stack.wait_healthy(600)
            if not all(health.values()):
                raise RuntimeError(f"services did not become healthy: {health}; logs in {self.run_dir / 'logs'}")
            p("stack healthy: " + ", ".join(health), done=True)
            self.watcher = TopicWatcher(self.stack.common.kafka_bootstrap, self.stack.topics)
            # RL rounds: a quarter of the KPI reports arrive late, as a product's outcome events do
            self.users: SimulatedUsers | AgentUsers
            if self.task.agent is not None:   # an agent task: sessions with an agent through the OpenAI door
                self.users = AgentUsers(self.task, self.stack.openai_base_url,
                                        self.stack.backend_token(self.task.tenant) or "none",
                                        ca_file=self.stack.creds.ca if self.stack.creds else None, seed=self.seed)
            else:
                self.users = SimulatedUsers(self.task, self.stack.inference_target, seed=self.seed,
                                            token=self.stack.backend_token(self.task.tenant),
                                            common=self.stack.client_common,
                                            late_fraction=0.25 if self.algo in ("grpo", "both") else 0.0,
                                            # GRPO alone learns from the KPI alone: no correction becomes
                                            # knowledge in context, so the held-out gain is the weights'
                                            corrections=self.algo != "grpo")
            self.evaluator = Evaluator(self.task, self.stack.inference_target, samples=self.budget.eval_samples,
                                       max_new_tokens=self.budget.max_new_tokens, common=self.stack.client_common)
            self._evaluate(0, deploy=None, started=time.monotonic())
            reviewer = threading.Thread(target=self._review_loop, name="demo-reviewer", daemon=True)
            reviewer.start()
            for k in range(1, self.budget.rounds + 1):
                started = time.monotonic()
                # the versions before this round's traffic: a small round may train and promote before its
                # deployment phase ends (all graded), and that version is this round's
                before = {m.version for m in self._versions()}
                deploy = self._deploy(k)
                self._wait_for_new_version(k, before)
                if self.plant_hack and k == 1:
                    self._plant_hack()
                self._evaluate(k, deploy=deploy, started=started)
        finally:
            self._reviewing.set()
            for closer in ("users", "evaluator", "watcher"):
                if hasattr(self, closer):
                    getattr(self, closer).close()
            self.stack.stop()
        return json.loads(self.report_path.read_text(encoding="utf-8"))

    def _deploy(self, k: int) -> dict[str, Any]:
        p = self.progress
        n = 4 if self.algo in ("grpo", "both") else 1
        new = {f for f, c in self.cohorts.items() if c == k}
        questions = self.users.pick(self.budget.users_per_round, new or None)
        p(f"round {k}: {len(questions)} simulated users asking (n={n})")
        late_before, abandoned_before = self.users.late_reported, self.users.abandoned
        exchanges = self.users.run(questions, max_new_tokens=self.budget.max_new_tokens, temperature=0.7, n=n)
        self.exchanges += exchanges
        late = self.users.late_reported - late_before
        abandoned = self.users.abandoned - abandoned_before
        if abandoned:
            p(f"round {k}: {abandoned} users gave up waiting for an answer", done=True)
        ids = {e.interaction_id for e in exchanges}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            graded = [g for i, g in self.watcher.snapshot().graded.items() if i in ids]
            p(f"round {k}: deployed {len(exchanges)} answers, graded {len(graded)}")
            if len(graded) >= len(ids):
                break
            time.sleep(2)
        resolved = sum(e.resolved for e in exchanges)
        # the reward-hacking detectors' verdicts on this round's answers; a quarantined one takes no gradient
        flags = Counter(f for g in graded for f in g.flags)
        quarantined = sum(g.quarantined for g in graded)
        p(f"round {k}: deployment KPI {resolved}/{len(exchanges)} resolved; hacking flags "
          + (", ".join(f"{name} {n}" for name, n in sorted(flags.items())) or "none")
          + f" ({quarantined} quarantined)", done=True)
        out = {"answers": len(exchanges), "resolved": resolved, "graded": len(graded), "late_kpi_reports": late,
               "abandoned_users": abandoned, "hacking_flags": dict(flags), "quarantined": quarantined,
               "policy_versions": sorted({e.policy_version for e in exchanges}),
               # what the notes cost: tokens of knowledge per request (served prompt less the bare question's)
               "knowledge_tokens_per_request": self._knowledge_tokens(exchanges)}
        if self.task.tool is not None:   # what the KPI said vs what happened, and the tool's use
            out.update(routed=sum(e.routed for e in exchanges), tool_calls=sum(e.tool_called for e in exchanges),
                       tool_timeouts=sum(e.tool_timed_out for e in exchanges))
            p(f"round {k}: truly routed {out['routed']}, tool calls {out['tool_calls']} "
              f"({out['tool_timeouts']} timed out)", done=True)
        return out

    def _knowledge_tokens(self, exchanges: list[Any]) -> float:
        """Mean tokens of context knowledge the round's requests carried: each served prompt's length less
        the same conversation's without notes (the chat template of the served model's tokenizer)."""
        from shared.decoding.chat_template import encode_chat
        from shared.models import load_tokenizer

        if not exchanges:
            return 0.0
        tok = load_tokenizer(self.model)
        bare = {q: len(encode_chat(tok, self.task.messages(q)).ids) for q in {e.question for e in exchanges}}
        return round(sum(max(0, e.prompt_tokens - bare[e.question]) for e in exchanges) / len(exchanges), 1)

    def _served_version(self) -> str:
        with self.stack.channel(self.stack.weights_target) as ch:
            st = weights_pb2_grpc.WeightsStub(ch).Status(weights_pb2.StatusRequest(model=self.model), timeout=10)
        versions = {p.tenant_versions.get(self.task.tenant) or p.tenant_versions.get("") or p.serving_version
                    for p in st.pods}
        versions |= {p.tenant_canaries.get(self.task.tenant) for p in st.pods if p.tenant_canaries.get(self.task.tenant)}
        self.served_seen |= versions
        return ",".join(sorted(versions))

    def _versions(self) -> list[weights_pb2.Manifest]:
        with self.stack.channel(self.stack.weights_target) as ch:
            return list(weights_pb2_grpc.WeightsStub(ch).List(weights_pb2.ListVersionsRequest(model=self.model),
                                                              timeout=10).versions)

    def _review_loop(self) -> None:
        """Review every 2 s while the run lasts: an approved correction then serves in context within seconds."""
        while not self._reviewing.wait(2.0):
            try:
                self._review_knowledge()
            except Exception as e:  # noqa: BLE001 - a failed review is retried at the next tick
                self.progress(f"knowledge review failed: {e}", done=True)

    def _fact_of(self, text: str) -> str:
        norm = " ".join(text.split()).lower()
        return next((f.id for f in self.task.facts if " ".join(f.correction.split()).lower() in norm), "")

    def _review_knowledge(self) -> int:
        """The operator's knowledge review, simulated. The corrections come from the product backend (end
        users' channel), so the extractor proposes them and never approves them itself; a person checks each
        proposal. Here the check is the task's ground truth: a proposal is approved, through the operator's
        Knowledge.Approve (audited, recorded on the item), when it restates one of the task's known
        corrections and the injection screen did not flag it; anything else stays proposed."""
        key = f"{self.task.tenant}/{self.task.task}"
        kb = self.watcher.snapshot().knowledge.get(key)
        known = [" ".join(f.correction.split()).lower() for f in self.task.facts]
        todo = [it.item_id for it in (kb.items if kb else []) if it.status == events_pb2.ITEM_STATUS_PROPOSED
                and not it.screen_flags and any(c in " ".join(it.text.split()).lower() for c in known)]
        if not todo:
            return 0
        approved = 0
        items = {it.item_id: it for it in kb.items} if kb else {}
        with self._review_lock, self.stack.channel(self.stack.knowledge_target) as ch:
            stub = knowledge_pb2_grpc.KnowledgeStub(ch)
            for item_id in todo:
                if item_id in self.approved_at:
                    continue
                try:
                    stub.Approve(knowledge_pb2.ItemActionRequest(key=key, item_id=item_id, operator="demo-reviewer"),
                                 timeout=30)
                    approved += 1
                    it = items[item_id]
                    self.approved_at[item_id] = (time.monotonic(), self._fact_of(it.text), tuple(it.questions))
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.NOT_FOUND:   # evicted by the cap meanwhile: nothing to do
                        raise
        self.progress(f"reviewer approved {approved} proposed knowledge item(s) of {key}", done=True)
        return approved

    def _wait_for_new_version(self, k: int, before: set[str]) -> None:
        """Until a version not in `before` is promoted and served (or every new one rejected by the gate)."""
        p = self.progress
        deadline = time.monotonic() + self.budget.round_timeout_s
        planned = int(self.budget.trainer_env.get("APPRENTICE_TRAINER_DISTILL_STEPS", 4)) if self.algo == "oel" else None
        training = TrainingProgress(self.stack.ports.metrics["trainer"], meter=progress_enabled(), planned_steps=planned)
        training.start()
        while time.monotonic() < deadline:
            new = [m for m in self._versions() if m.version not in before]
            kb = self.watcher.snapshot().knowledge.get(f"{self.task.tenant}/{self.task.task}")
            served = self._served_version()
            p(f"round {k}: knowledge v{kb.version if kb else 0} ({len(kb.items) if kb else 0} items), "
              f"new versions {[m.version + ':' + weights_pb2.VersionStatus.Name(m.status)[15:] for m in new]}, "
              f"served {served}" + (f", {t}" if (t := training.describe()) else ""))
            if round_settled(self.algo, new, served):
                break
            if self.stack.crashed():
                p(f"round {k}: restarts so far {self.stack.crashed()}")
            time.sleep(3)
        p(f"round {k}: serving {self._served_version()}", done=True)

    def _new_latencies(self) -> list[float]:
        """Correction-to-correct-answer latencies measured since the last round's report (each item once)."""
        with self._review_lock:
            approved = dict(self.approved_at)
        lat = correction_latencies(approved, self.exchanges)
        fresh = {i: s for i, s in lat.items() if i not in self._reported_latency}
        self._reported_latency |= set(fresh)
        return [round(s, 1) for s in fresh.values()]

    def _plant_hack(self) -> None:
        """Train the candidate that learned the loophole, upload it as a trainer would, and wait for the
        gate's verdict while the served version is watched (tools/demo/reward_hack.py)."""

        p = self.progress
        replies = hack_replies(self.exchanges, self.task)
        p("planting a reward-hacked candidate: fine-tuning the base on "
          + (f"the {len(replies)} hack replies the policy produced in traffic" if replies
             else "a canonical hack reply (the policy produced none in traffic)"), done=True)
        planted = train_planted(self.model, self.task, replies, self.run_dir / "planted", seed=self.seed)
        p(f"planted candidate: {planted.steps} steps in {planted.seconds:.0f} s, calls the tool on "
          f"{planted.tool_calls_held_out}/{planted.held_out} held-out messages", done=True)
        token = self.stack.creds.token(self.stack.creds.service_token) if self.stack.creds else None
        before = self._served_version()
        # the planted candidate stands in for a trainer's checkpoint: its CheckpointPublished carries the
        # trainer's signature (the keys directory is in the demo's environment, as the stack's), else the
        # weights service would dead-letter the announcement instead of gating it
        producer = EventProducer(self.stack.common.kafka_bootstrap, client_id="demo-planted-candidate",
                                 signer=record_signer(self.stack.common, "trainer"))
        with self.stack.channel(self.stack.weights_target, token=token) as ch:
            m = upload_planted(weights_pb2_grpc.WeightsStub(ch), producer, self.stack.topics.checkpoints, planted,
                               model=self.model, tenant=self.task.tenant, parent=before)
        p(f"planted candidate uploaded as {m.version}; waiting for the gate", done=True)
        deadline, status = time.monotonic() + self.budget.round_timeout_s, m.status
        while time.monotonic() < deadline:
            status = next((v.status for v in self._versions() if v.version == m.version), status)
            served = self._served_version()
            p(f"planted {m.version}: {weights_pb2.VersionStatus.Name(status)[15:]}, served {served}")
            if status in (weights_pb2.VERSION_STATUS_REJECTED, weights_pb2.VERSION_STATUS_PROMOTED):
                break
            time.sleep(3)
        p(f"planted {m.version}: {weights_pb2.VersionStatus.Name(status)[15:]}; served {self._served_version()}",
          done=True)
        self.planted = {**planted_summary(planted), "version": m.version, "parent": before}

    def _hack_check(self, state: Any) -> dict[str, Any] | None:
        if self.task.tool is None:
            return None

        manifests = self._versions()
        with self.stack.channel(self.stack.weights_target) as ch:
            trained = trained_lists(weights_pb2_grpc.WeightsStub(ch), manifests, self.trained_cache)
        check = verify(state, manifests, trained, self.planted["version"] if self.planted else None,
                       self.served_seen, self.task.tenant, self.exchanges)
        return {"planted": self.planted, **check}

    def _evaluate(self, k: int, *, deploy: dict[str, Any] | None, started: float) -> None:
        p = self.progress
        p(f"round {k}: evaluating held-out and out-of-distribution questions")
        serving = item_states(self.watcher.snapshot().knowledge.get(f"{self.task.tenant}/{self.task.task}"))["serving"]
        ev: dict[str, Any] = self.evaluator.run(k).as_dict()  # JSON-shaped; fields read by name below
        if serving:
            p(f"round {k}: evaluating the weights alone (no knowledge in context)")
            weights_only: dict[str, Any] = self.evaluator.run(k, knowledge=False).as_dict()
        else:   # nothing can be in context: the same requests, asked twice, would only re-sample
            weights_only = ev
        state = self.watcher.snapshot()
        kb = state.knowledge.get(f"{self.task.tenant}/{self.task.task}")
        versions = {m.version: m for m in self._versions()}
        served = ev["policy_version"]
        manifest = versions.get(served)
        entry = {
            "round": k, "eval": ev, "deploy": deploy, "seconds": round(time.monotonic() - started, 1),
            "knowledge_version": kb.version if kb else 0,
            "knowledge_items": [i.text for i in kb.items] if kb else [],
            "knowledge_states": item_states(kb),
            "eval_weights_only": weights_only,
            "correction_latency_s": self._new_latencies(),
            "policy_version": served,
            "manifest": {"algorithm": manifest.algorithm, "parent": manifest.parent_version,
                         "eval_results": [{"suite": r.suite, "metric": r.metric, "candidate": r.candidate,
                                           "baseline": r.baseline, "passed": r.passed, "comparison": r.comparison,
                                           "baseline_version": r.baseline_version} for r in manifest.eval_results],
                         "data_offsets": [{"topic": o.topic, "partition": o.partition, "start": o.start_offset,
                                           "end": o.end_offset} for o in manifest.data_offsets],
                         "train_metrics": dict(manifest.train_metrics)} if manifest else None,
            "versions_rejected": [v for v, m in versions.items() if m.status == weights_pb2.VERSION_STATUS_REJECTED],
            "train_steps": self.steps_log.new_steps(),   # the trainer's optimizer steps since the last round
            "train_rounds": self.steps_log.take_rounds(),  # and its round summaries (kept/sampled, sampling time)
        }
        self.rounds.append(entry)
        meta: dict[str, Any] = {"task": self.task.name, "tenant": self.task.tenant, "task_tag": self.task.task,
                "kpi": self.task.kpi.name, "task_source": self.task_source, "model": self.model, "algo": self.algo, "date": time.strftime("%Y-%m-%d"),
                "budget": self.budget.__dict__, "run_dir": str(self.run_dir), "topic_prefix": self.stack.topics.prefix,
                "services_restarted": self.stack.crashed(), "fact_cohorts": self.cohorts,
                # what the trainer ran with (the sweep's settings), its folders left out
                "trainer_settings": {k.removeprefix("APPRENTICE_TRAINER_").lower(): v
                                     for k, v in sorted(self.service_env["trainer"].items())
                                     if k.startswith("APPRENTICE_TRAINER_") and "DIR" not in k and "PATH" not in k}}
        if (hack := self._hack_check(state)) is not None:
            meta["reward_hack"] = hack
        report = write_report(self.report_path, meta, self.rounds)
        plot(self.plot_path, self.rounds, f"{self.task.name} · {self.model} · {self.algo}",
             notes=hack_notes(meta.get("reward_hack")))
        p(f"round {k}: held-out as served {ev['greedy_success'] + ev['sampled_success']}/{ev['greedy_total'] + ev['sampled_total']} "
          f"({ev['success_rate']:.0%}, 95% CI {ev['ci95'][0]:.0%}-{ev['ci95'][1]:.0%}), weights only "
          f"{weights_only['success_rate']:.0%}, items {entry['knowledge_states']}, OOD {ev['ood_success']}/"
          f"{ev['ood_total']}, {ev['mean_response_tokens']:.0f} tokens, knowledge items {len(entry['knowledge_items'])}, "
          f"version {served}", done=True)
        if k and report.get("summary"):
            s = report["summary"]
            p(f"round {k} vs 0: {s['heldout_diff']:+.0%} (95% CI {s['heldout_diff_ci95'][0]:+.0%} to "
              f"{s['heldout_diff_ci95'][1]:+.0%})", done=True)


def item_states(kb: Any) -> dict[str, int]:
    """Items by state, in the dashboard's words: pending, serving (in context), consolidated, retired, rejected."""
    names = {events_pb2.ITEM_STATUS_PROPOSED: "pending", events_pb2.ITEM_STATUS_APPROVED: "serving",
             events_pb2.ITEM_STATUS_PINNED: "serving", events_pb2.ITEM_STATUS_CONSOLIDATED: "consolidated",
             events_pb2.ITEM_STATUS_RETIRED: "retired", events_pb2.ITEM_STATUS_REJECTED: "rejected"}
    out = dict.fromkeys(("pending", "serving", "consolidated", "retired", "rejected"), 0)
    for it in kb.items if kb else []:
        out[names.get(it.status, "pending")] += 1
    return out


def correction_latencies(approved: dict[str, tuple[float, str, tuple[str, ...]]], exchanges: list[Any]) -> dict[str, float]:
    """Per approved item: seconds from its approval to the first correct answer to a *different* question of
    its fact (not one it was learned from), asked by another user after the approval."""
    out = {}
    for item_id, (at, fact, questions) in approved.items():
        asked = {" ".join(q.split()).lower() for q in questions}
        later = sorted((e for e in exchanges if e.fact_id == fact and e.asked_at >= at and e.routed
                        and " ".join(e.question.split()).lower() not in asked), key=lambda e: e.answered_at)
        if later:
            out[item_id] = later[0].answered_at - at
    return out


def round_settled(algo: str, new: list[weights_pb2.Manifest], served: str) -> bool:
    """A round is over once its newest promoted version serves, or the gate refused every new candidate.
    With `--algo both` it also needs its consolidation (an `oel*` version) settled: the GRPO version usually
    settles first, and a demo that moved on then distilled once in two rounds."""
    settled = [m for m in new if m.status in (weights_pb2.VERSION_STATUS_PROMOTED, weights_pb2.VERSION_STATUS_REJECTED)]
    if algo == "both" and not any(m.algorithm.startswith("oel") for m in settled):
        return False
    promoted = [m for m in settled if m.status == weights_pb2.VERSION_STATUS_PROMOTED]
    if promoted:
        return served == promoted[-1].version
    return bool(settled) and len(settled) == len(new)   # every candidate refused: the old version keeps serving


def reply_tokens(budget: int, flag: int | None, task_cap: int | None) -> int:
    """The reply cap of a run: `--max-new-tokens` when given, else the budget's within the task's own cap."""
    if flag is not None:
        return flag
    return budget if task_cap is None else min(budget, task_cap)


def run_demo(task_name: str, *, rounds: int | None, report: Path, quick: bool, algo: str, model: str | None,
             seed: int = 0, keep_runs: int = 2, plant_hack: bool = False, users: int | None = None,
             max_new_tokens: int | None = None, trainer_env: dict[str, str] | None = None,
             facts_per_round: int = 0) -> dict[str, Any]:
    """`users`, `max_new_tokens` (the reply cap, for deployment and evaluation alike; default the budget's
    within the task's own cap) and `trainer_env` (trainer settings as environment variables) change the
    budget of one run: a sweep runs the same demo with only these changed, and the report records them."""
    task = load_task(task_name)
    common = CommonSettings()
    budget = DemoBudget.quick(rounds or 1) if quick else DemoBudget.full(rounds or (RL_ROUNDS if algo == "grpo" else 2),
                                                                        algo)
    if users is not None:
        budget.users_per_round = users
    budget.max_new_tokens = reply_tokens(budget.max_new_tokens, max_new_tokens, task.max_new_tokens)
    budget.trainer_env.update(trainer_env or {})
    # The new run counts among the kept ones: keep_runs=1 leaves only this run's folder.
    for old in prune_runs(common.home / "demo", keep=max(keep_runs - 1, 0)):
        print(f"removed old demo run folder {old}", flush=True)
    run_dir = new_run_dir(common.home / "demo")
    demo = Demo(task, model=model or common.model, budget=budget, algo=algo, report=report,
                plot_path=report.with_name("learning_curve.png") if report.suffix == ".json" else report.with_suffix(".png"),
                run_dir=run_dir, seed=seed, plant_hack=plant_hack, facts_per_round=facts_per_round,
                task_source=str(Path(task_name).resolve()) if Path(task_name).exists() else task_name)
    return demo.run()
