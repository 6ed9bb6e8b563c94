"""Extraction pipeline: batching, rate limiting, retries, correction items; the OpenAI-compatible client
against a real local HTTP server; the factory and settings validation."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from services.extractor.extraction import ExtractionSettings, Extractor, RateLimiter, correction_item
from services.extractor.llm import ExtractorLLM, LLMRequest, LLMResponse, LLMUnavailable
from services.extractor.llm_kinds import make_llm
from services.extractor.llm_openai import OpenAICompatibleLLM
from services.extractor.settings import ExtractorSettings, InferenceLLMSettings, OpenAILLMSettings
from services.extractor.trajectories import SessionBuffer, Trajectory
from tests.unit.extractor.factories import graded


class ScriptedLLM(ExtractorLLM):
    """A stand-in LLM for the pipeline's unit tests: answers from a script, fails the first `down` calls."""

    name = "scripted"

    def __init__(self, answer: str, down: int = 0) -> None:
        self.answer, self.down = answer, down
        self.batches: list[list[LLMRequest]] = []

    def complete(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        self.batches.append(list(requests))
        if self.down > 0:
            self.down -= 1
            raise LLMUnavailable("not yet")
        return [LLMResponse(text=self.answer, model="scripted", policy_version="v7") for _ in requests]


def trajectories(n: int) -> list[Trajectory]:
    buf = SessionBuffer(gap_s=0, max_turns=8)
    for i in range(n):
        buf.add(graded(session=f"s{i}", iid=f"i{i}", correction="24 months" if i == 0 else ""))
    return [t for t, _ in buf.ready()]


def test_rate_limiter_bucket() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    rl = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0], sleep=sleep)
    assert rl.acquire(2) == 0.0                 # the burst
    assert rl.acquire(1) == pytest.approx(0.5)  # then 2 per second
    now[0] += 10
    assert rl.acquire(2) == 0.0                 # refilled, but never beyond the burst
    assert rl.acquire(1) == pytest.approx(0.5)


def test_batches_seeds_items_and_corrections() -> None:
    llm = ScriptedLLM("Sure!\n- EXPERIENCE ITEM: Check the warranty table first.\n- EXPERIENCE ITEM: Answer in one sentence.\n"
                      "- EXPERIENCE ITEM: A third item over the limit.")
    ex = Extractor(llm, ExtractionSettings(batch_size=2, max_items=2))
    trajs = trajectories(3)
    out = ex.extract(trajs, lambda key: ["Old rule."])
    assert [len(b) for b in llm.batches] == [2, 1]
    req = llm.batches[0][0]
    assert req.tenant == "acme" and req.seed == trajs[0].seed and "Old rule." in req.messages[0]["content"]
    assert [c.text for c in out[0].candidates] == ["Check the warranty table first.", "Answer in one sentence.",
                                                   "How long is the warranty? 24 months"]
    assert out[0].candidates[2].questions == ["How long is the warranty?"]      # beside the fact, not in it
    assert out[0].candidates[0].created_by == "llm:scripted@v7" and out[0].candidates[2].created_by == "correction"
    assert out[0].candidates[0].sources == ["i0"] and out[1].policy_version == "v7"


def test_corrections_only_never_calls_the_llm() -> None:
    llm = ScriptedLLM("- EXPERIENCE ITEM: never asked for.", down=5)      # would fail if it were called
    out = Extractor(llm, ExtractionSettings(llm_items=False)).extract(trajectories(2), lambda key: [])
    assert llm.batches == []
    assert [c.text for c in out[0].candidates] == ["How long is the warranty? 24 months"]
    assert out[0].candidates[0].created_by == "correction" and out[1].candidates == []


def test_retries_then_gives_up() -> None:
    llm = ScriptedLLM("- EXPERIENCE ITEM: Fine rule after a retry.", down=1)
    ex = Extractor(llm, ExtractionSettings(retries=2, retry_backoff_s=0.0))
    assert ex.extract(trajectories(1), lambda key: [])[0].candidates[0].text == "Fine rule after a retry."
    with pytest.raises(LLMUnavailable):
        Extractor(ScriptedLLM("x", down=5), ExtractionSettings(retries=2, retry_backoff_s=0.0)).extract(trajectories(1), lambda k: [])


def test_correction_item_states_the_fact_and_bounds_it() -> None:
    assert correction_item("We use form\n R-12 for   every return.", "Which form?") == "We use form R-12 for every return."
    assert correction_item("Use form R-12.", "Which form do I need?") == "Which form do I need? Use form R-12."
    assert correction_item("Form R-12", "return paperwork") == "return paperwork: Form R-12"
    long = correction_item("x " * 400)
    assert len(long) == 400 and long.endswith("...")


# --- the OpenAI-compatible client, against a real HTTP server on loopback ------------------------------------
class _Handler(BaseHTTPRequestHandler):
    seen: list[tuple[dict, str]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append((body, self.headers.get("Authorization", "")))
        if _Handler.status != 200:
            self.send_response(_Handler.status)
            self.end_headers()
            self.wfile.write(b'{"error": "slow down"}')
            return
        text = f"- EXPERIENCE ITEM: Reply to {body['messages'][0]['content'][:13]} politely."
        payload = {"model": body["model"], "choices": [{"message": {"role": "assistant", "content": text}}]}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen, _Handler.status = [], 200
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_openai_compatible_endpoint(http_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_EXTRACTOR_KEY", "sk-test")
    llm = OpenAICompatibleLLM(http_server, "teacher-7b", api_key_env="TEST_EXTRACTOR_KEY", timeout_s=5)
    reqs = [LLMRequest(messages=[{"role": "user", "content": f"prompt {i} text"}], seed=i + 1) for i in range(3)]
    out = llm.complete(reqs)
    assert [r.text for r in out] == [f"- EXPERIENCE ITEM: Reply to prompt {i} text politely." for i in range(3)]
    assert all(r.model == "teacher-7b" for r in out)
    body, auth = _Handler.seen[0]
    assert auth == "Bearer sk-test" and body["max_tokens"] == 192 and body["temperature"] == 0.7
    _Handler.status = 429
    with pytest.raises(LLMUnavailable, match="429"):
        llm.complete(reqs[:1])
    _Handler.status = 400
    assert llm.complete(reqs[:1])[0].error.startswith("HTTP 400")
    llm.close()


def test_unreachable_endpoint_is_recoverable() -> None:
    llm = OpenAICompatibleLLM("http://127.0.0.1:9/v1", "m", timeout_s=2)
    with pytest.raises(LLMUnavailable):
        llm.complete([LLMRequest(messages=[{"role": "user", "content": "x"}])])


def test_factory_and_settings_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_llm(ExtractorSettings(llm=InferenceLLMSettings())).name == "inference"
    assert make_llm(ExtractorSettings(llm=OpenAILLMSettings(kind="openai", model="m"))).name == "openai"
    with pytest.raises(ValueError, match="LLM__MODEL is required"):
        ExtractorSettings(llm=OpenAILLMSettings(kind="openai"))
    unknown: Any = {"kind": "nonsense"}         # not one of the union's kinds: refused at run time
    with pytest.raises(ValueError):
        ExtractorSettings(llm=unknown)
    with pytest.raises(ValueError, match="both"):
        ExtractorSettings(require_approval_tenants=["a"], auto_approve_tenants=["a"])
    monkeypatch.setenv("APPRENTICE_EXTRACTOR_REQUIRE_APPROVAL", "true")
    monkeypatch.setenv("APPRENTICE_EXTRACTOR_AUTO_APPROVE_TENANTS", "demo,acme")
    s = ExtractorSettings()
    assert not s.tenant_requires_approval("acme") and s.tenant_requires_approval("bank")


def test_items_copied_from_the_prompt_are_dropped() -> None:
    llm = ScriptedLLM("- EXPERIENCE ITEM: Your task: Compare what you did with the final result and the feedback.\n"
                      "- Round1: Grader feedback: -1.00 (user feedback)\n"
                      "- EXPERIENCE ITEM: Old rule that was already known.\n"
                      "- EXPERIENCE ITEM: Confirm the product model before quoting a warranty.")
    ex = Extractor(llm, ExtractionSettings(correction_items=False))
    [out] = ex.extract(trajectories(1), lambda key: ["Old rule that was already known."])
    assert [c.text for c in out.candidates] == ["Confirm the product model before quoting a warranty."]
    assert ex.echoes == 2
