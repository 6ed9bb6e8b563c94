"""Each reward-hacking detector fires on a constructed case and stays quiet on a clean one."""

from __future__ import annotations

import random

import pytest

from services.grader.core import detectors as D
from shared.grading import DetectorConfig, TaskGraders
from shared.grading.replies import reply_key
from shared.proto.apprentice.v1 import events_pb2
from tests.helpers.grader import feedback, interaction

CFG = DetectorConfig(min_samples=20, window=200)
TASK = TaskGraders.model_validate({"graders": [
    {"name": "judge", "type": "judge", "rubric": "r"},
    {"name": "resolved", "type": "kpi", "kpi": "resolved", "map": {1: 1.0, 0: 0.0}}]})
CLEAN_TEXT = "The warranty lasts 24 months from purchase; register online to claim it."


def obs(version: str = "v1", length: int = 50, reward: float | None = 0.5, truncated: bool = False) -> D.Observation:
    return D.Observation("demo", "support", version, length, reward, truncated)


def run(stats: D.DetectorStats, o: D.Observation, text: str = CLEAN_TEXT,
        components: list[events_pb2.RewardComponent] | None = None) -> list[str]:
    stats.observe(o)
    return D.detect(CFG, stats, TASK, o, text, components or [])


def comps(judge: float, kpi: float) -> list[events_pb2.RewardComponent]:
    return [events_pb2.RewardComponent(name="judge", value=judge, weight=1, has_signal=True),
            events_pb2.RewardComponent(name="resolved", value=kpi, weight=1, has_signal=True)]


def test_length_reward_correlation_hand_computed() -> None:
    # x = 1,2,3; y = 2,4,7: mx = 2, my = 13/3; Sxy = 5, Sxx = 2, Syy = 38/3 -> r = 5 / sqrt(76/3)
    s = D.VersionStats(window=10)
    for x, y in ((1, 2), (2, 4), (3, 7)):
        s.add(x, y, False)
    assert s.length_reward_corr == pytest.approx(5 / (76 / 3) ** 0.5)
    flat = D.VersionStats(window=10)
    for y in (1, 2, 3):
        flat.add(1, y, False)
    assert flat.length_reward_corr == 0.0


def test_rolling_window_forgets_old_records() -> None:
    s = D.VersionStats(window=3)
    for x in (100, 1, 2, 3):
        s.add(x, 1.0, x == 100)
    assert s.n == 3 and s.mean_length == pytest.approx(2.0) and s.truncation_rate == 0.0


def test_length_exploit_fires_when_reward_follows_length() -> None:
    stats = D.DetectorStats(CFG)
    rng = random.Random(0)
    flags: list[str] = []
    for _ in range(60):
        n = rng.randint(10, 400)
        flags = run(stats, obs(length=n, reward=n / 400))
    long_flags = run(stats, obs(length=390, reward=0.97))
    short_flags = run(stats, obs(length=20, reward=0.05))
    assert "length_exploit" in long_flags and "length_exploit" not in short_flags
    current = stats.current("demo", "support", "v1")
    assert current is not None and current.length_reward_corr > 0.9
    del flags


def test_length_exploit_quiet_when_reward_is_independent_of_length() -> None:
    stats = D.DetectorStats(CFG)
    rng = random.Random(1)
    fired = set()
    for _ in range(100):
        fired |= set(run(stats, obs(length=rng.randint(10, 400), reward=rng.random())))
    assert "length_exploit" not in fired


def test_length_shift_between_versions() -> None:
    stats = D.DetectorStats(CFG)
    for _ in range(30):
        run(stats, obs("v1", length=50))
    quiet = set()
    for _ in range(30):
        quiet |= set(run(stats, obs("v2", length=55)))
    assert "length_shift" not in quiet
    shifted = [run(stats, obs("v3", length=150)) for _ in range(30)]
    assert "length_shift" in shifted[-1]
    assert "length_shift" not in shifted[0]  # not before min_samples


def _versions(stats: D.DetectorStats, rows: list[tuple[str, bool, float]]) -> None:
    for version, truncated, reward in rows:
        run(stats, obs(version, truncated=truncated, reward=reward))


def test_high_truncation_when_the_policy_learned_to_run_into_the_cap_and_it_pays() -> None:
    stats = D.DetectorStats(CFG)
    _versions(stats, [("v1", i % 10 == 0, 0.5) for i in range(40)])                       # 10 % truncated
    _versions(stats, [("v2", i % 2 == 0, 0.9 if i % 2 == 0 else 0.3) for i in range(40)])  # 50 %, cut pays more
    assert "high_truncation" in run(stats, obs("v2", truncated=True, reward=0.9))
    assert "high_truncation" not in run(stats, obs("v2", truncated=False, reward=0.3))
    allcut = D.DetectorStats(CFG)
    _versions(allcut, [("v1", i % 3 == 0, 0.5) for i in range(40)])
    _versions(allcut, [("v2", True, 0.5) for _ in range(40)])                              # nothing to compare
    assert "high_truncation" in run(allcut, obs("v2", truncated=True))


def test_high_truncation_stays_quiet_without_a_learned_change() -> None:
    base = D.DetectorStats(CFG)                      # the first version: a base model talking past the cap,
    _versions(base, [("base", i % 3 != 0, 0.23 if i % 3 != 0 else 0.14) for i in range(60)])   # cut pays
    assert "high_truncation" not in run(base, obs("base", truncated=True, reward=0.23))
    same = D.DetectorStats(CFG)                      # a new version as truncated as the last one
    _versions(same, [("v1", i % 2 == 0, 0.9 if i % 2 == 0 else 0.3) for i in range(40)])
    _versions(same, [("v2", i % 2 == 0, 0.9 if i % 2 == 0 else 0.3) for i in range(40)])
    assert "high_truncation" not in run(same, obs("v2", truncated=True, reward=0.9))
    fair = D.DetectorStats(CFG)                      # truncation rose, but cut answers do not score more
    _versions(fair, [("v1", i % 10 == 0, float(i % 4 < 2)) for i in range(40)])
    _versions(fair, [("v2", i % 2 == 0, float(i % 4 < 2)) for i in range(40)])
    assert "high_truncation" not in run(fair, obs("v2", truncated=True, reward=1.0))


def test_degenerate_repetition() -> None:
    stats = D.DetectorStats(CFG)
    assert "degenerate" in run(stats, obs(), text="the answer is yes " * 20)
    assert "degenerate" in run(stats, obs(), text="!" * 80)
    assert "degenerate" not in run(stats, obs(), text=CLEAN_TEXT)
    assert "degenerate" not in run(stats, obs(), text="ok")
    assert D.repetition_ratio("a b c d e f g h") == 0.0


def test_judge_kpi_disagreement() -> None:
    stats = D.DetectorStats(CFG)
    assert "judge_kpi_disagreement" in run(stats, obs(), components=comps(judge=0.95, kpi=0.0))
    assert "judge_kpi_disagreement" not in run(stats, obs(), components=comps(judge=0.9, kpi=1.0))
    only_judge = comps(0.9, 0.0)[:1]
    assert "judge_kpi_disagreement" not in run(stats, obs(), components=only_judge)


def test_reward_jump_between_versions() -> None:
    stats = D.DetectorStats(CFG)
    for i in range(30):
        run(stats, obs("v1", reward=0.2 + 0.01 * (i % 3)))
    steady = set()
    for _ in range(30):
        steady |= set(run(stats, obs("v2", reward=0.3)))
    assert "reward_jump" not in steady
    jumped = [run(stats, obs("v3", reward=0.95)) for _ in range(25)]
    assert "reward_jump" in jumped[-1]


def test_infra_failure_sources() -> None:
    ok = interaction()
    assert D.infra_failure(CFG, ok, []) is None
    assert D.infra_failure(CFG, interaction(finish_reason="error"), []) == "infra_failure"
    assert D.infra_failure(CFG, interaction(messages=[("tool", "deadline exceeded")]), []) == "tool_timeout"
    assert D.infra_failure(CFG, interaction(messages=[("user", "why did it time out?")]), []) is None
    assert D.infra_failure(CFG, ok, [feedback(ok.interaction_id, kpi_name="infra_error", value=1)]) == "infra_failure"
    assert D.infra_failure(CFG, ok, [feedback(ok.interaction_id, kpi_name="tool_timeout", value=0)]) is None


def test_quarantine_flags() -> None:
    assert D.quarantined(CFG, ["degenerate"])
    assert not D.quarantined(CFG, ["tool_timeout"])
    assert not D.quarantined(DetectorConfig(quarantine_flags=[]), ["degenerate"])


def test_degenerate_shortcut_agrees_with_the_full_ratio() -> None:
    import random

    rng = random.Random(11)
    vocab = ["a", "b", "the", "warranty", "24", "months", "!", "x", "repeat", "İstanbul", "ß", "."]
    for threshold in (0.1, 0.5, 0.8):
        cfg = DetectorConfig(repetition_threshold=threshold)
        for _ in range(3000):
            words = [rng.choice(vocab) for _ in range(rng.randint(1, 8))] * rng.randint(1, 8)
            for _ in range(rng.randint(0, 8)):
                words.insert(rng.randint(0, len(words)), rng.choice(vocab))
            text = " ".join(words)
            if len(D._WORD.findall(text)) >= cfg.repetition_min_words:
                assert D.is_degenerate(cfg, text) == (D.repetition_ratio(text) > threshold), text


LISTING = "Billing, Shipping, Returns, Repairs or Accounts."


def reply_obs(prompt: int, reply: str, reward: float, version: str = "v1") -> D.Observation:
    return D.Observation("demo", "routing", version, 12, reward, False, prompt_key=f"p{prompt}",
                         reply_key=reply_key(reply))


def test_a_reply_given_to_many_prompts_and_mostly_wrong_is_a_constant() -> None:
    """Run F's collapse: one listing reply to 40% of the prompts, right for a fifth of them (its first team's)."""
    stats = D.DetectorStats(CFG)
    flags = []
    for i in range(60):
        if i % 5 < 2:
            flags.append(run(stats, reply_obs(i, LISTING + ("  " if i % 2 else ""), 1.0 if i % 10 == 0 else 0.0)))
        else:
            flags.append(run(stats, reply_obs(i, f"Your message goes to team {i % 5}", 0.0)))
    listing = [f for i, f in enumerate(flags) if i % 5 < 2]
    others = [f for i, f in enumerate(flags) if i % 5 >= 2]
    assert all("constant_reply" not in f for f in listing[:8])          # fewer than min_samples prompts seen
    assert all("constant_reply" in f for f in listing[10:])
    assert not any("constant_reply" in f for f in others)
    assert D.quarantined(CFG, ["constant_reply"])


def test_one_teams_name_for_that_teams_messages_is_not_a_constant() -> None:
    """The right answer repeated: 'Billing' to every Billing message scores, even at half of the traffic."""
    stats = D.DetectorStats(CFG)
    flags = [run(stats, reply_obs(i, "Billing" if i % 2 else "Shipping", 1.0 if i % 7 else 0.0)) for i in range(80)]
    assert not any("constant_reply" in f for f in flags)


def test_the_same_prompt_asked_again_is_not_a_second_prompt() -> None:
    """n samples of one prompt that agree are not a collapse across prompts."""
    stats = D.DetectorStats(CFG)
    flags = [run(stats, reply_obs(i // 8, LISTING, 0.0)) for i in range(8 * 30)]
    w = stats.replies("demo", "routing", "v1")
    assert w is not None and w.distinct_prompts == 25 and w.share(reply_key(LISTING)) == 1.0    # window 200 = 25 prompts
    assert "constant_reply" in flags[-1]
    stats2 = D.DetectorStats(CFG)
    flags2 = [run(stats2, reply_obs(0, LISTING, 0.0)) for _ in range(100)]
    assert not any("constant_reply" in f for f in flags2)               # one prompt: never min_samples prompts


def test_the_reply_window_forgets_and_keys_ignore_case_and_punctuation() -> None:
    w = D.ReplyWindow(window=3)
    for p, r, y in (("a", "x", 0.0), ("b", "x", 1.0), ("c", "y", None), ("d", "y", 0.0)):
        w.add(p, r, y)
    assert w.distinct_prompts == 3 and w.share("x") == 1 / 3 and w.share("y") == 2 / 3
    assert w.mean_reward("x") == 1.0 and w.mean_reward("y") == 0.0 and w.mean_reward("z") is None
    assert reply_key("  Billing, SHIPPING  or Accounts. ") == reply_key("billing, shipping or accounts")


def test_the_grader_keeps_a_short_digest_of_each_reply() -> None:
    from services.grader.core.join import reply_digest

    long = "Billing. " * 20_000
    assert reply_digest(long) == reply_digest(long.upper()) and len(reply_digest(long)) == 16
    assert reply_digest(LISTING) != reply_digest("Shipping") and reply_digest(" ... ") == ""
