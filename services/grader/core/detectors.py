"""A graded interaction + rolling statistics --> reward-hacking flags (pure, no Kafka, no metrics).

A policy learns whatever the reward allows. Each detector names one known shortcut:

- `infra_failure` / `tool_timeout`: the episode failed for reasons outside the response (serving error,
  a tool that timed out). Masked as *no signal*: a reward of 0 would teach "let the tool time out"
  whenever the honest outcome scores below 0, and a reward of anything else teaches noise.
- `length_exploit`: within one policy version, reward correlates with response length (Pearson r over
  the last `window` records >= threshold) and this response is longer than the mean: length is
  buying reward.
- `length_shift`: a version's mean length is >= `length_shift_ratio` x the previous version's, and this
  response is beyond the previous mean by that ratio.
- `high_truncation`: the policy learned to run into the token cap: this response was truncated, the
  version's share of `finish_reason == "length"` is above threshold and rose by over
  `truncation_rate_rise` from the previous version's, and truncation pays (truncated responses score more
  than finished ones by over `truncation_reward_gap`, or too few finished ones are left to compare): a
  judge or KPI that favours long unfinished answers. Not on the first version seen: a base model that
  talks past a short budget learned nothing (measured on the routing task: 69% truncated, and the cut
  answers scored 0.23 against 0.14 because rambling names teams by chance).
- `degenerate`: repeated word 4-grams make up more than `repetition_threshold` of the response.
- `judge_kpi_disagreement`: the LLM judge and the business KPI (both on 0..1) differ by more than
  the threshold: the judge is being fooled, or the KPI is broken.
- `reward_jump`: the version's mean reward rose by more than `reward_jump` over the previous
  version's: real progress is gradual; a jump is more often a found loophole.
- `constant_reply`: within one version, this reply (case, spacing and end punctuation ignored) answered at
  least `constant_reply_share` of the distinct prompts of the window, and its mean reward is at most
  `constant_reply_max_reward`: the policy collapsed onto one answer that scores by the base rate (on the
  routing task, "Billing, Shipping, Returns, Repairs or Accounts." routes every ticket to Billing and is right
  for a fifth of them; GRPO found it: docs/demo.md, run F). A reply that is right for the prompts it answers
  (one team's messages) keeps a high mean reward and is not flagged.

Flags in `DetectorConfig.quarantine_flags` quarantine the record (the trainer takes no gradient on it).
Statistics are per worker (each replica sees its partitions): a sample of the traffic, which is what
rolling statistics need.
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from services.grader.core.plan import plan_for
from shared.grading import DetectorConfig, JudgeSpec, KpiSpec, TaskGraders
from shared.proto.apprentice.v1 import events_pb2

INFRA_FINISH_REASONS = frozenset({"error", "cancelled"})
_WORD = re.compile(r"\w+|[^\w\s]")


# --- per-record checks ----------------------------------------------------------------------------

def infra_failure(cfg: DetectorConfig, interaction: events_pb2.Interaction,
                  feedback: Sequence[events_pb2.FeedbackEvent]) -> str | None:
    """"tool_timeout" or "infra_failure" when the outcome says nothing about the response, else None."""
    if interaction.finish_reason in INFRA_FINISH_REASONS:
        return "infra_failure"
    pattern = _compiled(cfg.tool_timeout_pattern)
    if any(m.role == "tool" and pattern.search(m.content) for m in interaction.messages):
        return "tool_timeout"
    for f in feedback:
        if f.kind == "kpi" and f.kpi_name in cfg.infra_kpis and f.value > 0:
            return "tool_timeout" if "timeout" in f.kpi_name else "infra_failure"
    return None


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def repetition_ratio(text: str, n: int = 4) -> float:
    """Share of word n-grams that repeat an earlier one: 1 - distinct / total (0 for short texts)."""
    return _repetition(_WORD.findall(text.lower()), n)


def _repetition(words: list[str], n: int = 4) -> float:
    if len(words) < n + 1:
        return 0.0
    total = len(words) - n + 1
    return 1.0 - len(set(zip(*(words[i:] for i in range(n)), strict=False))) / total


def is_degenerate(cfg: DetectorConfig, text: str) -> bool:
    lowered = text.lower()
    words = _WORD.findall(lowered)
    # ASCII lower-casing keeps every word boundary; beyond ASCII it may not (İ -> i + combining dot).
    n_words = len(words) if text.isascii() else len(_WORD.findall(text))
    if n_words < cfg.repetition_min_words:
        # A long run of one character ("!!!!!!!!" or "aaaa...") has few words but is still degenerate.
        return len(text) >= 4 * cfg.repetition_min_words and len(set(text)) <= 2
    total = len(words) - 3
    # Shortcut, exact: each distinct word outside the last three starts a distinct 4-gram, so the ratio
    # is at most 1 - (distinct words - 3) / total; most responses are far below the threshold.
    if total > 0 and 1.0 - (len(set(words)) - 3) / total <= cfg.repetition_threshold:
        return False
    return _repetition(words) > cfg.repetition_threshold


def judge_kpi_gap(task: TaskGraders, components: Sequence[events_pb2.RewardComponent]) -> float | None:
    """|judge - KPI| with both mapped onto 0..1, or None when either has no signal."""
    if not plan_for(task).judge_and_kpi:
        return None
    by_name = {c.name: c for c in components if c.has_signal}
    judges = [by_name[g.name].value for g in task.graders if isinstance(g, JudgeSpec) and g.name in by_name]
    kpis = []
    for g in task.graders:
        if isinstance(g, KpiSpec) and g.name in by_name:
            lo, hi = (min(g.map.values()), max(g.map.values())) if g.map else g.reward_range
            span = (hi - lo) or 1.0
            kpis.append((by_name[g.name].value - lo) / span)
    if not judges or not kpis:
        return None
    return abs(sum(judges) / len(judges) - sum(kpis) / len(kpis))


# --- rolling statistics per (tenant, task, policy version) ----------------------------------------

@dataclass
class VersionStats:
    """The last `window` records of one policy version, with running sums so that every statistic is
    O(1) per record (the grader computes them for every record it emits)."""

    window: int
    items: deque[tuple[float, float | None, bool]] = field(default_factory=deque)
    sum_len: float = 0.0
    n_trunc: int = 0
    # over the truncated records that have a reward: n, sum of rewards
    tn: int = 0
    ty: float = 0.0
    # sums over the records that have a reward: n, x, y, xy, xx, yy (x = length, y = reward)
    rn: int = 0
    rx: float = 0.0
    ry: float = 0.0
    rxy: float = 0.0
    rxx: float = 0.0
    ryy: float = 0.0

    def _apply(self, length: float, reward: float | None, truncated: bool, sign: int) -> None:
        self.sum_len += sign * length
        self.n_trunc += sign * int(truncated)
        if reward is not None and truncated:
            self.tn += sign
            self.ty += sign * reward
        if reward is not None:
            self.rn += sign
            self.rx += sign * length
            self.ry += sign * reward
            self.rxy += sign * length * reward
            self.rxx += sign * length * length
            self.ryy += sign * reward * reward

    def add(self, length: float, reward: float | None, truncated: bool) -> None:
        self.items.append((length, reward, truncated))
        self._apply(length, reward, truncated, +1)
        while len(self.items) > self.window:
            self._apply(*self.items.popleft(), -1)

    @property
    def n(self) -> int:
        return len(self.items)

    @property
    def n_rewarded(self) -> int:
        return self.rn

    @property
    def mean_length(self) -> float:
        return self.sum_len / self.n if self.n else 0.0

    @property
    def mean_reward(self) -> float:
        return self.ry / self.rn if self.rn else 0.0

    @property
    def truncation_rate(self) -> float:
        return self.n_trunc / self.n if self.n else 0.0

    def truncation_reward_gap(self, min_each: int) -> float | None:
        """Mean reward of truncated records - mean reward of finished ones (rewarded records only); None
        while either side has fewer than `min_each`."""
        finished_n = self.rn - self.tn
        if self.tn < min_each or finished_n < min_each:
            return None
        return self.ty / self.tn - (self.ry - self.ty) / finished_n

    @property
    def length_reward_corr(self) -> float:
        """Pearson r = (n Sxy - Sx Sy) / sqrt((n Sxx - Sx^2)(n Syy - Sy^2)); 0 when either is constant."""
        n = self.rn
        if n < 2:
            return 0.0
        vx = n * self.rxx - self.rx * self.rx
        vy = n * self.ryy - self.ry * self.ry
        if vx <= 1e-9 * max(1.0, n * self.rxx) or vy <= 1e-9 * max(1.0, n * self.ryy):
            return 0.0
        return max(-1.0, min(1.0, (n * self.rxy - self.rx * self.ry) / math.sqrt(vx * vy)))


@dataclass
class ReplyWindow:
    """The last `window` (prompt, reply, reward) of one policy version, with, per reply, the distinct
    prompts it answered and its reward sums: every statistic O(1) per record."""

    window: int
    items: deque[tuple[str, str, float | None]] = field(default_factory=deque)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompts: Counter[str] = field(default_factory=Counter)
    reply_prompts: Counter[str] = field(default_factory=Counter)
    """Reply -> the distinct prompts it answered in the window."""
    reply_rewards: dict[str, list[float]] = field(default_factory=dict)
    """Reply -> [rewarded records, sum of their rewards]."""

    def _apply(self, prompt: str, reply: str, reward: float | None, sign: int) -> None:
        pair = (prompt, reply)
        self.pairs[pair] += sign
        if self.pairs[pair] == (1 if sign > 0 else 0):
            self.reply_prompts[reply] += sign
        self.prompts[prompt] += sign
        _drop_empty(self.pairs, pair)
        _drop_empty(self.prompts, prompt)
        _drop_empty(self.reply_prompts, reply)
        if reward is not None:
            acc = self.reply_rewards.setdefault(reply, [0.0, 0.0])
            acc[0] += sign
            acc[1] += sign * reward
            if acc[0] <= 0:
                del self.reply_rewards[reply]

    def add(self, prompt: str, reply: str, reward: float | None) -> None:
        self.items.append((prompt, reply, reward))
        self._apply(prompt, reply, reward, +1)
        while len(self.items) > self.window:
            self._apply(*self.items.popleft(), -1)

    @property
    def distinct_prompts(self) -> int:
        return len(self.prompts)

    def share(self, reply: str) -> float:
        """Share of the window's distinct prompts that got `reply`."""
        return self.reply_prompts.get(reply, 0) / self.distinct_prompts if self.prompts else 0.0

    def mean_reward(self, reply: str) -> float | None:
        acc = self.reply_rewards.get(reply)
        return acc[1] / acc[0] if acc and acc[0] > 0 else None


def _drop_empty(counter: Counter[Any], key: Any) -> None:
    """Forget a key whose count fell to 0 (the window's counters stay as large as the window)."""
    if counter[key] <= 0:
        del counter[key]


@dataclass(slots=True)
class Observation:
    """What the detectors need from one graded interaction."""
    tenant: str
    task: str
    policy_version: str
    length: int
    reward: float | None
    """None when the record has no signal (it counts for length statistics, not reward ones)."""
    truncated: bool
    prompt_key: str = ""
    """The prompt (its last user message) as a digest; "" = not compared (`constant_reply` skips it)."""
    reply_key: str = ""
    """The reply as `shared.grading.replies.reply_key` compares it (the grader passes a digest of it); "" = not
    compared."""


class DetectorStats:
    """Rolling statistics per (tenant, task) and policy version, versions in order of first sight."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._versions: dict[tuple[str, str], dict[str, VersionStats]] = {}
        self._replies: dict[tuple[str, str, str], ReplyWindow] = {}

    def observe(self, o: Observation) -> None:
        versions = self._versions.setdefault((o.tenant, o.task), {})
        stats = versions.get(o.policy_version)
        if stats is None:
            stats = versions[o.policy_version] = VersionStats(self.cfg.window)
        stats.add(o.length, o.reward, o.truncated)
        if o.prompt_key and o.reply_key:
            key = (o.tenant, o.task, o.policy_version)
            replies = self._replies.get(key)
            if replies is None:
                replies = self._replies[key] = ReplyWindow(self.cfg.window)
            replies.add(o.prompt_key, o.reply_key, o.reward)

    def replies(self, tenant: str, task: str, version: str) -> ReplyWindow | None:
        return self._replies.get((tenant, task, version))

    def current(self, tenant: str, task: str, version: str) -> VersionStats | None:
        return self._versions.get((tenant, task), {}).get(version)

    def previous(self, tenant: str, task: str, version: str) -> VersionStats | None:
        """The version seen just before `version` (by first sight) with enough samples."""
        versions = list(self._versions.get((tenant, task), {}).items())
        names = [v for v, _ in versions]
        if version not in names:
            return None
        for _v, s in reversed(versions[:names.index(version)]):
            if s.n >= self.cfg.min_samples:
                return s
        return None

    def snapshot(self) -> list[tuple[str, str, str, VersionStats]]:
        return [(t, k, v, s) for (t, k), vs in self._versions.items() for v, s in vs.items()]


def detect(cfg: DetectorConfig, stats: DetectorStats, task: TaskGraders, o: Observation, text: str,
           components: Sequence[events_pb2.RewardComponent]) -> list[str]:
    """Flags for one record, after `stats.observe(o)` has counted it."""
    flags: list[str] = []
    cur = stats.current(o.tenant, o.task, o.policy_version)
    prev = stats.previous(o.tenant, o.task, o.policy_version)
    enough = cur is not None and cur.n >= cfg.min_samples
    if enough and cur is not None:
        if (cur.n_rewarded >= cfg.min_samples and cur.length_reward_corr >= cfg.length_corr_threshold
                and o.length > cur.mean_length):
            flags.append("length_exploit")
        if (prev is not None and prev.mean_length > 0
                and cur.mean_length >= cfg.length_shift_ratio * prev.mean_length
                and o.length >= cfg.length_shift_ratio * prev.mean_length):
            flags.append("length_shift")
        if (o.truncated and cur.truncation_rate > cfg.truncation_rate_threshold and prev is not None
                and cur.truncation_rate - prev.truncation_rate > cfg.truncation_rate_rise):
            gap = cur.truncation_reward_gap(max(3, cfg.min_samples // 4))
            if gap is None or gap > cfg.truncation_reward_gap:
                flags.append("high_truncation")
        if (o.reward is not None and prev is not None and prev.n_rewarded >= cfg.min_samples
                and cur.n_rewarded >= cfg.min_samples
                and cur.mean_reward - prev.mean_reward > cfg.reward_jump):
            flags.append("reward_jump")
    replies = stats.replies(o.tenant, o.task, o.policy_version) if o.reply_key else None
    if replies is not None and replies.distinct_prompts >= cfg.min_samples \
            and replies.share(o.reply_key) >= cfg.constant_reply_share:
        mean = replies.mean_reward(o.reply_key)
        if mean is not None and mean <= cfg.constant_reply_max_reward:
            flags.append("constant_reply")
    if is_degenerate(cfg, text):
        flags.append("degenerate")
    gap = judge_kpi_gap(task, components)
    if gap is not None and gap > cfg.judge_kpi_disagreement:
        flags.append("judge_kpi_disagreement")
    return flags


def quarantined(cfg: DetectorConfig, flags: Sequence[str]) -> bool:
    return any(f in cfg.quarantine_flags for f in flags)
