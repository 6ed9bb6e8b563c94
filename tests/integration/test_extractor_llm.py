"""The extractor with its default LLM: the policy through a real Inference gRPC server.

Two servers: the real `services/inference` (tiny model; proves tenant, policy version and no_capture), and a
minimal Inference servicer started by these tests (real gRPC on loopback, real model, sampling through
`shared.decoding.generation`), which records every request so the prompt itself can be checked. The tiny random model
writes garbage that must not crash anything; SmolLM2-135M-Instruct (slow) extracts from real FrozenLake
episodes (textarena `FrozenLake-v0-raw`, 3x3 with 2 holes as in the paper).
"""

from __future__ import annotations

import importlib.util
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from services.extractor.curation import approx_tokens
from services.extractor.extraction import is_echo
from services.extractor.parser import parse_items
from services.extractor.service import ExtractorApp
from services.extractor.settings import ExtractorSettings, InferenceLLMSettings
from services.extractor.trajectories import knowledge_key
from shared.contracts.events import make_envelope
from shared.contracts.topics import Topics
from shared.proto.apprentice.v1 import common_pb2, events_pb2, inference_pb2, inference_pb2_grpc
from shared.rpc.grpc_util import create_server
from tests.helpers.signing import signed_producer
from tests.unit.extractor.factories import graded

pytestmark = pytest.mark.integration


class InTestInference(inference_pb2_grpc.InferenceServicer):
    """Minimal Inference.Generate over a real model; remembers what it was asked."""

    def __init__(self, model_name: str, policy_version: str = "base") -> None:
        from shared.models import load_model

        self.model, self.tok = load_model(model_name)
        self.policy_version = policy_version
        self.requests: list[inference_pb2.GenerateRequest] = []
        self.answers: list[str] = []
        self._lock = threading.Lock()

    def Generate(self, request: inference_pb2.GenerateRequest, context: Any) -> inference_pb2.GenerateResponse:  # noqa: N802
        from shared.decoding.generation import generate, render_chat
        from shared.decoding.params import SamplingConfig

        sp = request.sampling
        cfg = SamplingConfig(max_new_tokens=sp.max_new_tokens or 64, temperature=sp.temperature, top_p=sp.top_p or 1.0,
                             top_k=sp.top_k, stop=tuple(sp.stop), seed=sp.seed or None, n=1)
        prompt = render_chat(self.tok, request.messages) if request.messages else request.prompt
        [[sample]] = generate(self.model, self.tok, [prompt], cfg)   # concurrent calls decode in parallel
        with self._lock:
            self.requests.append(request)
            self.answers.append(sample.text)
        return inference_pb2.GenerateResponse(
            choices=[inference_pb2.Choice(text=sample.text, finish_reason=sample.finish_reason,
                                          token_count=len(sample.token_ids))],
            policy_version=self.policy_version)


@pytest.fixture
def inference(request: pytest.FixtureRequest) -> Iterator[tuple[InTestInference, int]]:
    servicer = InTestInference(request.param)
    server, port, _health = create_server(0, lambda s: inference_pb2_grpc.add_InferenceServicer_to_server(servicer, s),
                                          ["apprentice.v1.Inference"], host="127.0.0.1", max_workers=4)
    server.start()
    yield servicer, port
    server.stop(1.0).wait(2)


def run_extractor(settings: ExtractorSettings, topics: Topics, kafka_bootstrap: str,
                  records: list[events_pb2.GradedInteraction], key: str, expect_calls: int,
                  timeout: float = 60.0) -> tuple[ExtractorApp, events_pb2.KnowledgeSnapshot | None]:
    """Produce `records`, run the extractor until it made `expect_calls` LLM calls and no session is left
    open; returns the app (stopped) and the final base (None if nothing was worth a snapshot)."""
    p = signed_producer(kafka_bootstrap, "grader")   # graded records are the grader's
    for r in records:
        p.produce(topics.graded, r.interaction.session_id, r)
    p.flush()
    app = ExtractorApp(settings, count_tokens=approx_tokens)
    app.rebuild()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.poll_once()
        if app.extractor.calls >= expect_calls and len(app.buffer) == 0:
            break
    app.stop()
    return app, app.store.latest(key)


@pytest.mark.parametrize("inference", ["tiny-random"], indirect=True)
def test_tiny_model_through_real_inference_grpc(inference: tuple[InTestInference, int], topics: Topics,
                                                kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    servicer, port = inference
    monkeypatch.setenv("APPRENTICE_MODEL", "tiny-random")
    settings = ExtractorSettings(llm=InferenceLLMSettings(endpoint=f"127.0.0.1:{port}"), port=0, metrics_port=0,
                                 group_id=f"extractor-{uuid.uuid4().hex[:6]}", session_gap_s=0.0, max_new_tokens=48,
                                 batch_size=2, rate_limit_per_s=50, rate_burst=2)
    records = [
        graded(session="chat", iid="t1", at_s=0, has_signal=False, reward=0.0),
        graded(session="chat", iid="t2", at_s=1, question="And the batteries?", answer="Also one year.",
               history=[("How long is the warranty?", "One year.")], correction="Batteries have 6 months of warranty."),
        graded(session="other", iid="t3", question="Where is my parcel?", answer="I don't know.", thumbs=-1.0,
               comment="useless"),
    ]
    app, snap = run_extractor(settings, topics, kafka_bootstrap, records, "acme/support", expect_calls=2)
    # the extractor asked the policy through gRPC: one prompt per closed session, tenant kept, not captured
    assert len(servicer.requests) == 2
    assert all(r.tenant == "acme" and r.no_capture and r.sampling.seed > 0 for r in servicer.requests)
    chat = next(r for r in servicer.requests if "And the batteries?" in r.messages[0].content)
    assert "Round1_Input: How long is the warranty?" in chat.messages[0].content
    assert "Round2_Input: And the batteries?" in chat.messages[0].content
    assert "Final Result: Failure" in chat.messages[0].content
    # garbage answers did not crash anything; whatever parsed is readable text, the correction is an item
    assert snap is not None and snap.extractor_policy_version == "base" and snap.extractor_model == "tiny-random"
    texts = {it.text: it for it in snap.items}
    corr = texts["Batteries have 6 months of warranty."]
    assert list(corr.questions) == ["And the batteries?"]
    assert list(corr.source_interaction_ids) == ["t2"]
    for it in snap.items:
        if it.created_by.startswith("llm:"):
            assert it.created_by == "llm:tiny-random@base" and parse_items(f"- EXPERIENCE ITEM: {it.text}") == [it.text]
    assert app.extractor.calls == 2


@pytest.mark.skipif(importlib.util.find_spec("services.inference.service") is None,
                    reason="services/inference is not in this build")
def test_tiny_model_through_the_inference_service(topics: Topics, kafka_bootstrap: str, tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `services/inference` server as the extractor LLM: extraction prompts are served with the
    tenant's policy and never captured as interactions."""
    from tests.helpers.inference import start_inference
    from tests.helpers.kafka import read_all

    monkeypatch.setenv("APPRENTICE_MODEL", "tiny-random")
    inference = start_inference(tmp_path, bootstrap=kafka_bootstrap, topic_prefix=topics.prefix)
    try:
        settings = ExtractorSettings(llm=InferenceLLMSettings(endpoint=f"127.0.0.1:{inference.port}"), port=0,
                                     metrics_port=0, group_id=f"extractor-{uuid.uuid4().hex[:6]}", session_gap_s=0.0,
                                     max_new_tokens=32)
        records = [graded(session="s1", iid="r1", correction="Batteries have 6 months of warranty."),
                   graded(session="s2", iid="r2", thumbs=-1.0, comment="wrong")]
        app, snap = run_extractor(settings, topics, kafka_bootstrap, records, "acme/support", expect_calls=2)
    finally:
        inference.stop(1.0)
    assert app.extractor.calls == 2
    assert snap is not None and snap.extractor_model == "tiny-random" and snap.extractor_policy_version == "base"
    assert any(it.created_by == "correction" and list(it.source_interaction_ids) == ["r1"] for it in snap.items)
    assert read_all(kafka_bootstrap, topics.interactions, timeout=3, idle=1.0) == []   # no_capture honoured


# --- SmolLM2 on real FrozenLake trajectories ----------------------------------------------------------------
ROLLOUT = ("You are an agent playing a game on a grid, acting as a reasoning engine.\n\nCurrent situation:\n{obs}\n\n"
           "Reply with exactly one action: [up], [down], [left] or [right].")


def play_frozenlake(servicer: InTestInference, seed: int, max_steps: int = 3) -> list[events_pb2.GradedInteraction]:
    """One episode of FrozenLake-v0-raw (3x3, 2 holes, as in the paper) played by the policy; each step is an
    interaction of one session, the last one graded with the environment's reward."""
    import textarena as ta

    from shared.decoding.generation import generate, render_chat
    from shared.decoding.params import SamplingConfig

    env = ta.make("FrozenLake-v0-raw", size=3, num_holes=2)
    env.reset(num_players=1, seed=seed)
    session, done = f"frozenlake-{seed}", False
    steps: list[tuple[str, str]] = []
    rewards: dict[int, float] = {}
    while not done and len(steps) < max_steps:
        _pid, obs = env.get_observation()
        text = "\n".join(m for _src, m, *_ in obs).replace("Welcome to Frozen Lake!", "").strip()
        msgs = [{"role": "user", "content": ROLLOUT.format(obs=text[-1200:])}]
        [[sample]] = generate(servicer.model, servicer.tok, [render_chat(servicer.tok, msgs)],
                              SamplingConfig(max_new_tokens=24, temperature=0.7, top_p=0.8, top_k=20, seed=seed * 10 + len(steps) + 1))
        done, _info = env.step(sample.text)
        steps.append((msgs[0]["content"], sample.text))
    rewards, game_info = env.close() if done else ({0: 0.0}, {0: {"reason": "step limit reached"}})
    reward = float(rewards.get(0, 0.0)) if isinstance(rewards, dict) else 0.0
    reason = str((game_info or {}).get(0, {}).get("reason", "")) if isinstance(game_info, dict) else ""
    out = []
    for i, (prompt, answer) in enumerate(steps):
        last = i == len(steps) - 1
        inter = events_pb2.Interaction(
            envelope=make_envelope("games", source="test"), interaction_id=f"{session}-{i}", session_id=session,
            task="frozenlake", model="smollm2-135m-instruct", policy_version="base",
            messages=[common_pb2.ChatMessage(role="user", content=prompt)], response_text=answer)
        out.append(events_pb2.GradedInteraction(
            envelope=make_envelope("games", source="test"), interaction=inter, revision=1, reward=reward if last else 0.0,
            has_signal=last, success=last and reward >= 1.0,
            components=[events_pb2.RewardComponent(name="env", value=reward, weight=1.0, has_signal=True,
                                                   detail=reason or "episode ended")] if last else []))
    return out


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(importlib.util.find_spec("textarena") is None,
                    reason="textarena not installed (pip install 'apprentice[envs]')")
@pytest.mark.parametrize("inference", ["smollm2-135m-instruct"], indirect=True)
def test_smollm2_extracts_parseable_items_from_frozenlake(inference: tuple[InTestInference, int], topics: Topics,
                                                          kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    servicer, port = inference
    monkeypatch.setenv("APPRENTICE_MODEL", "smollm2-135m-instruct")
    seeds = (11, 12, 13)
    t0 = time.monotonic()
    records = [r for seed in seeds for r in play_frozenlake(servicer, seed)]
    t_play = time.monotonic() - t0
    key = knowledge_key("games", "frozenlake")
    settings = ExtractorSettings(llm=InferenceLLMSettings(endpoint=f"127.0.0.1:{port}"), port=0, metrics_port=0,
                                 group_id=f"extractor-{uuid.uuid4().hex[:6]}", session_gap_s=0.0, max_new_tokens=128,
                                 batch_size=len(seeds), request_timeout_s=900, correction_items=False)
    t0 = time.monotonic()
    app, snap = run_extractor(settings, topics, kafka_bootstrap, records, key, expect_calls=len(seeds), timeout=1200)
    t_extract = time.monotonic() - t0
    answers = servicer.answers
    parsed = [parse_items(a, max_items=2) for a in answers]
    print(f"\nplayed {len(seeds)} episodes ({len(records)} steps) in {t_play:.0f}s, extracted in {t_extract:.0f}s")
    print("--- SmolLM2 extraction answers ---\n" + "\n---\n".join(answers))
    print("--- items ---\n" + "\n".join(it.text for it in (snap.items if snap else [])))
    print(f"parsed {sum(map(len, parsed))} items, {app.extractor.echoes} of them copied from the prompt")
    # the answers yield parseable items; what reaches the base is curated: no prompt echoes, sane length,
    # provenance pointing at the episode's steps
    assert len(answers) == len(seeds) and sum(len(p) for p in parsed) >= 1, answers
    prompts = [r.messages[0].content for r in servicer.requests]
    for it in snap.items if snap is not None else []:
        assert it.created_by == "llm:smollm2-135m-instruct@base" and 12 <= len(it.text) <= 400
        assert not any(is_echo(it.text, p) for p in prompts)
        assert set(it.source_interaction_ids) <= {r.interaction.interaction_id for r in records}
