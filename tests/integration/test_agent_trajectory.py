"""An agent's session as one trajectory, end to end: the real inference service (gRPC, tiny model), the real
broker and grader, the trainer's buffer and RL round.

Three turns of one session: the model calls a tool twice (the request's messages carry the assistant's
tool calls and the tool results, or, in the `user` variant, later user turns), then answers. The third
turn's Interaction holds the whole trajectory; a KPI on the session's outcome, sent through inference's
Feedback RPC on the last turn, rewards it; in the trainer's batch exactly the tokens between the model's
own turns (the tool results with the template's text around them) are masked, and the model's sampled
tokens keep their recorded behaviour log-probs (docs/agents.md, "Agent trajectories"). The same holds when
the requests name no session and only resend the history, as OpenAI SDK agents do.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.inference.client import InferenceClient
from shared.contracts.topics import Topics
from shared.kafka.admin import ensure_topics
from shared.proto.apprentice.v1 import common_pb2, events_pb2
from tests.helpers.grader import GraderProcess, delete_namespace, graded, grader_env
from tests.helpers.kafka import TopicReader, collect

pytestmark = pytest.mark.integration

TASK = "agent-trajectory"
CONFIG = f"""
version: agent-1
tasks:
  - tenant: "*"
    task: {TASK}
    feedback_window_s: 120
    graders:
      - {{name: resolved, type: kpi, kpi: resolved, map: {{1: 1.0, 0: 0.0}}, weight: 1.0, success: true}}
"""
RESULTS = ('{"order": 42, "status": "shipped"}', '{"carrier": "DHL", "eta": "Monday"}')


def _session(c: InferenceClient, env_role: str, attempt: int, named: bool) -> tuple[list[str], list[str]]:
    """Three turns of one session; returns the interaction ids and the texts the environment added after
    turns 1 and 2. Sampled (seeded): the tiny random model's greedy answers are runs of newlines, which the
    template's text merges with its own (a re-tokenised history, covered by tests/unit/test_agent_trajectory.py).
    `named`: the requests name their session; else they only resend the history, as OpenAI SDK agents do."""
    msgs = [common_pb2.ChatMessage(role="system", content="You are the order desk of a shop. You look orders up "
                                   f"with the lookup tool and answer in one sentence. (attempt {attempt})"),
            common_pb2.ChatMessage(role="user", content="Where is my order 42?")]
    ids, added = [], []
    for turn in range(3):
        r = c.generate(msgs, max_new_tokens=6, temperature=1.0, seed=100 * attempt + turn + 1,
                       session_id=f"agent-session-{attempt}" if named else "", task=TASK)
        choice = r.choices[0]
        ids.append(choice.interaction_id)
        if turn == 2:
            break
        call = common_pb2.ToolCall(id=f"call-{turn}", name="lookup", arguments='{"order_id": 42}')
        msgs.append(common_pb2.ChatMessage(role="assistant", content=choice.text or " ", tool_calls=[call]))
        if env_role == "tool":
            msgs.append(common_pb2.ChatMessage(role="tool", tool_call_id=call.id, name="lookup", content=RESULTS[turn]))
        else:
            msgs.append(common_pb2.ChatMessage(role="user", content=f"The lookup returned {RESULTS[turn]}"))
        added.append(RESULTS[turn])
    return ids, added


@pytest.mark.parametrize(("env_role", "named"), [("tool", True), ("user", True), ("user", False)])
def test_three_turn_session_is_one_rewarded_trajectory_with_environment_masked(
        env_role: str, named: bool, kafka_bootstrap: str, tiny_model_name: str, tmp_path: Path) -> None:
    from services.trainer import losses
    from services.trainer.batching import make_batch
    from services.trainer.buffer import ACCEPTED, RolloutBuffer
    from services.trainer.rl import loss_mask
    from shared.models import load_model
    from tests.helpers.inference import start_inference
    from tests.unit.trainer.test_rl import make_trainer

    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}.")
    ensure_topics(kafka_bootstrap, topics)
    inference = start_inference(tmp_path / "inference", model=tiny_model_name, bootstrap=kafka_bootstrap,
                                topic_prefix=topics.prefix, follow_updates=False, heartbeat_interval_s=0)
    cfg = tmp_path / "grader.yaml"
    cfg.write_text(CONFIG)
    grader = GraderProcess(grader_env(topics.prefix, kafka_bootstrap, cfg, tmp_path), tmp_path / "grader.log").start()
    reader = TopicReader(kafka_bootstrap, topics.graded)
    try:
        with InferenceClient(f"127.0.0.1:{inference.port}", tenant="acme") as c:
            # the first session whose answers come back token for token (an answer that ends in another
            # special token, or starts with a space the template trims, is re-tokenised otherwise)
            for attempt in range(12):
                ids, added = _session(c, env_role, attempt, named)
                events = {e.interaction_id: e for e in collect(kafka_bootstrap, topics.interactions,
                                                                events_pb2.Interaction, want=ids)}
                first, second, third = (events[i] for i in ids)
                full1 = [*first.prompt_token_ids, *first.response_token_ids]
                full2 = [*second.prompt_token_ids, *second.response_token_ids]
                if (list(second.prompt_token_ids[:len(full1)]) == full1
                        and list(third.prompt_token_ids[:len(full2)]) == full2):
                    break
            else:
                pytest.fail("no session of 12 came back token for token")
            ack = c.feedback(ids[-1], "kpi", 1.0, kpi_name="resolved")
            assert ack.event_id

        # 1) capture: the third turn is the trajectory of the session, token for token
        assert not first.HasField("trajectory")
        traj = third.trajectory
        assert list(traj.interaction_ids) == ids[:2] and list(second.trajectory.interaction_ids) == ids[:1]
        p0 = len(first.prompt_token_ids)
        assert traj.prompt_length == p0 and list(third.prompt_token_ids[:p0]) == list(first.prompt_token_ids)
        # where each earlier turn's sampled tokens sit in the third prompt, and what the environment added
        model_spans = [range(p0, len(full1)), range(len(second.prompt_token_ids), len(full2))]
        env_spans = [range(len(full1), len(second.prompt_token_ids)), range(len(full2), len(third.prompt_token_ids))]
        expected_env = [True] * (len(third.prompt_token_ids) - p0)
        for span in model_spans:
            for j in span:
                expected_env[j - p0] = False
        assert list(traj.environment) == expected_env
        assert traj.realigned_tokens == 0
        outcome = "continued" if named else "by_history"
        assert (REGISTRY.get_sample_value("apprentice_inference_trajectory_turns_total", {"outcome": outcome}) or 0) >= 2
        # the environment spans are the tool results (with the template's text around them)
        model, tok = load_model(tiny_model_name)
        for span, text in zip(env_spans, added, strict=True):
            assert text in tok.decode([third.prompt_token_ids[j] for j in span])
        # the model's tokens carry the behaviour log-probs they were sampled with
        lp = dict(zip(range(p0, len(full1)), first.response_logprobs_t1, strict=True))
        for j, v in lp.items():
            assert traj.logprobs_t1[j - p0] == pytest.approx(v)

        # 2) the grader: the session's KPI on its last turn rewards the trajectory
        recs = reader.wait_for(lambda rs: any(r.interaction.interaction_id == ids[-1] and r.has_signal for r in rs),
                               90, parse=graded)
        [g] = [r for r in recs if r.interaction.interaction_id == ids[-1] and r.has_signal]
        assert g.reward == 1.0 and g.success and g.interaction.trajectory.interaction_ids == ids[:2], grader.log_tail()

        # 3) the trainer: one rollout, environment masked in its batch, trained on the model's tokens only
        buf = RolloutBuffer("acme")
        assert buf.offer(g, 0.0) == ACCEPTED
        [rollout] = buf.ready(0.0)
        assert rollout.prompt_ids == list(first.prompt_token_ids)
        assert rollout.completion_ids == [*third.prompt_token_ids[p0:], *third.response_token_ids]
        b = make_batch([rollout.prompt_ids], [rollout.completion_ids], pad_id=0)
        mask = loss_mask(b, [rollout])[0].tolist()
        masked = {j for j, m in enumerate(mask) if m == 0}
        assert masked == {j - p0 for span in env_spans for j in span}
        assert losses.model_token_mask(b.completion_mask, b.completion_mask)[0].sum() == 0
        trainer = make_trainer((model, tok), batch_size=1, micro_batch_size=1)
        result = trainer.rl_round([g])
        assert result.trained_ids == [ids[-1]]
        assert result.metrics["tokens"] == rollout.model_tokens == len(mask) - len(masked)
    finally:
        reader.close()
        grader.stop()
        inference.stop(grace=0)
        with contextlib.suppress(Exception):
            delete_namespace(kafka_bootstrap, topics.prefix)
