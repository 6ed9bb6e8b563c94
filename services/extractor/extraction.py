"""Trajectories --> candidate experience items: OEL prompts, batched and rate-limited LLM calls, parsing.

Per trajectory: 1) the extraction prompt with the previous knowledge of its base; 2) one LLM completion
(seeded by the trajectory, so a redelivery samples the same text); 3) at most `max_items` parsed items;
4) when enabled, one item per correction: the corrected answer itself, which states the missing fact (a small
policy rarely writes a usable rule), with the question it answered kept beside it (`Candidate.questions`),
not glued into the text: an item states a fact, and a "When asked X, answer Y" template is what a model
trained on it would then echo.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.extractor.curation import jaccard, normalise
from services.extractor.knowledge import Candidate, Extracted
from services.extractor.llm import ExtractorLLM, LLMRequest, LLMResponse, LLMUnavailable
from services.extractor.parser import looks_like_text, parse_items
from services.extractor.prompt import build_prompt
from services.extractor.trajectories import Trajectory, least_trusted
from shared.retry import call

log = logging.getLogger(__name__)


class RateLimiter:
    """Token bucket: at most `rate` acquisitions per second on average, `burst` back to back."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst = rate, float(burst)
        self._tokens = float(burst)
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0

    def acquire(self, n: int = 1) -> float:
        """Take `n` tokens, sleeping as needed; returns the seconds waited."""
        waited = 0.0
        for _ in range(n):
            with self._lock:
                while True:
                    now = self._clock()
                    self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                    self._last = now
                    if self._tokens >= 1.0:
                        self._tokens -= 1.0
                        break
                    delay = (1.0 - self._tokens) / self.rate
                    self._sleep(delay)
                    waited += delay
        self.waited_s += waited
        return waited


def is_echo(item: str, prompt: str, min_words: int = 4) -> bool:
    """An item copied from the prompt (its instructions, a feedback line, a previous item): small models do
    this a lot, and such text is no new experience. Compared on normalised text: containment, or a prompt
    line with the same words."""
    if not prompt:
        return False
    norm = normalise(item)
    if len(norm.split()) >= min_words and norm in normalise(prompt):
        return True
    return any(jaccard(item, line) >= 0.8 for line in prompt.splitlines() if len(line.split()) >= min_words)


def correction_item(correction: str, question: str = "", *, min_words: int = 5, max_chars: int = 400) -> str:
    """A correction as an item: the corrected answer, whitespace collapsed. An answer too short to say
    what it is about on its own ("24 months") is prefixed with the question it answered, as a heading
    ("How long is the battery warranty? 24 months"), so the item still states a fact when read alone."""
    a = " ".join(correction.split())
    q = short_question(question, 160) if question.strip() else ""
    if q and (len(a.split()) < min_words or not looks_like_text(a)):
        a = f"{q if q.endswith('?') else q + ':'} {a}"
    return a if len(a) <= max_chars else a[: max_chars - 3].rstrip() + "..."


def short_question(question: str, max_chars: int = 300) -> str:
    q = " ".join(question.split())
    return q if len(q) <= max_chars else q[: max_chars - 3].rstrip() + "..."


@dataclass
class ExtractionSettings:
    max_new_tokens: int = 192
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    batch_size: int = 4
    max_items: int = 2
    max_turn_chars: int = 1500
    max_prompt_chars: int = 6000
    include_previous: bool = True
    correction_items: bool = True
    llm_items: bool = True
    retries: int = 3
    retry_backoff_s: float = 1.0


class Extractor:
    def __init__(self, llm: ExtractorLLM, cfg: ExtractionSettings, limiter: RateLimiter | None = None) -> None:
        self.llm = llm
        self.cfg = cfg
        self.limiter = limiter
        self.calls = 0
        self.parsed_items = 0
        self.empty_answers = 0
        self.echoes = 0

    def request_for(self, traj: Trajectory, previous: Sequence[str]) -> LLMRequest:
        msgs = build_prompt(traj, previous if self.cfg.include_previous else [],
                            max_turn_chars=self.cfg.max_turn_chars, max_prompt_chars=self.cfg.max_prompt_chars)
        return LLMRequest(messages=msgs, tenant=traj.tenant, max_new_tokens=self.cfg.max_new_tokens,
                          temperature=self.cfg.temperature, top_p=self.cfg.top_p, top_k=self.cfg.top_k,
                          seed=traj.seed)

    def _complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        def once() -> list[LLMResponse]:
            if self.limiter is not None:
                self.limiter.acquire(len(requests))
            self.calls += len(requests)
            out = self.llm.complete(requests)
            if len(out) != len(requests):
                raise LLMUnavailable(f"{self.llm.name} answered {len(out)} of {len(requests)} requests")
            return out

        b = self.cfg.retry_backoff_s   # waits b, 2b, 4b ... capped at 8b; the last LLMUnavailable is raised
        return call(once, retry_on=LLMUnavailable, what=f"extractor LLM {self.llm.name}",
                    attempts=max(1, self.cfg.retries), first_s=b, max_s=8 * b, log=log)

    def extract(self, trajectories: Sequence[Trajectory],
                previous: Callable[[str], Sequence[str]]) -> list[Extracted]:
        """Candidates for each trajectory, in order. Raises LLMUnavailable when the LLM stays down."""
        if not self.cfg.llm_items:       # corrections only: no LLM call at all
            return [Extracted(t, self._correction_candidates(t)) for t in trajectories]
        results: list[Extracted] = []
        for start in range(0, len(trajectories), self.cfg.batch_size):
            chunk = list(trajectories[start:start + self.cfg.batch_size])
            requests = [self.request_for(t, previous(t.key)) for t in chunk]
            responses = self._complete(requests)
            for traj, req, resp in zip(chunk, requests, responses, strict=True):
                results.append(self._candidates(traj, resp, req.messages[-1]["content"]))
        return results

    def _candidates(self, traj: Trajectory, resp: LLMResponse, prompt: str = "") -> Extracted:
        ids = traj.interaction_ids
        parsed = parse_items(resp.text)
        fresh = [i for i in parsed if not is_echo(i, prompt)]
        self.echoes += len(parsed) - len(fresh)
        items = fresh[: self.cfg.max_items]
        if not items:
            self.empty_answers += 1
        self.parsed_items += len(items)
        by = f"llm:{resp.model or self.llm.name}@{resp.policy_version or '?'}"
        # an LLM item may be built from anything in the trajectory: it is as trusted as its least trusted caller
        who = least_trusted(traj.sources)
        asked = [short_question(t.input_text) for t in traj.turns if t.input_text.strip()][-3:]
        cands = [Candidate(text, by, ids, who, questions=asked) for text in items] + self._correction_candidates(traj)
        if resp.error:
            log.warning("extraction request failed", extra={"key": traj.key, "error": resp.error})
        return Extracted(traj, cands, extractor_model=resp.model, policy_version=resp.policy_version)

    def _correction_candidates(self, traj: Trajectory) -> list[Candidate]:
        if not self.cfg.correction_items:
            return []
        return [Candidate(correction_item(corr, turn.input_text), "correction", [turn.interaction_id], who,
                          detail=f"feedback {who.event_id}; asked by {turn.asked_by.role or 'unknown'}:"
                                 f"{turn.asked_by.key_id or '?'}",
                          questions=[short_question(turn.input_text)] if turn.input_text.strip() else [])
                for turn, corr, who in traj.sourced_corrections]
