"""Agent trajectories assembled from a session's turns at capture time (services/inference/trajectory.py):
token in, token out, with tool results and later user turns as environment tokens, and an edited history
that keeps only what still equals the policy's samples."""

from __future__ import annotations

from services.inference.trajectory import HEAD_TOKENS, SessionTurns, assemble, best, head_key, turn_of
from shared.proto.apprentice.v1 import events_pb2


def _event(iid: str, prompt: list[int], resp: list[int], traj: events_pb2.Trajectory | None = None
           ) -> events_pb2.Interaction:
    ev = events_pb2.Interaction(interaction_id=iid, prompt_token_ids=prompt, response_token_ids=resp,
                                response_logprobs=[-0.5] * len(resp),
                                response_logprobs_t1=[-float(t) / 100 for t in resp])
    if traj is not None:
        ev.trajectory.CopyFrom(traj)
    return ev


def test_three_turns_mark_tool_results_and_user_turns_as_environment() -> None:
    p1 = [1, 2, 3]                      # system + first user + assistant header
    r1 = [10, 11]                       # the model's tool call
    tool = [90, 91, 92]                 # template glue + tool result + assistant header
    p2 = p1 + r1 + tool
    t1 = turn_of(_event("a", p1, r1))
    assert t1 is not None
    traj2 = assemble(t1, p2)
    assert traj2 is not None
    assert traj2.prompt_length == 3
    assert list(traj2.environment) == [False, False, True, True, True]
    assert [round(x, 4) for x in traj2.logprobs_t1] == [-0.10, -0.11, 0.0, 0.0, 0.0]
    assert list(traj2.interaction_ids) == ["a"]

    r2 = [12, 13, 14]
    user = [95, 96]                     # a later user turn: environment as well
    p3 = p2 + r2 + user
    t2 = turn_of(_event("b", p2, r2, traj2))
    assert t2 is not None
    traj3 = assemble(t2, p3)
    assert traj3 is not None
    env = list(traj3.environment)
    assert env == [False, False, True, True, True, False, False, False, True, True]
    assert list(traj3.interaction_ids) == ["a", "b"]
    assert traj3.realigned_tokens == 0


def test_edited_first_prompt_starts_a_new_trajectory() -> None:
    t1 = turn_of(_event("a", [1, 2, 3, 4, 5], [10, 11]))
    assert t1 is not None
    assert assemble(t1, [1, 9, 3, 4, 5, 10, 11, 90]) is None
    assert best([t1], [1, 9, 3, 4, 5, 10, 11, 90]) is None


def test_generation_prompt_merging_with_the_answer_still_continues() -> None:
    """`assistant\\n` + an answer starting with a newline re-tokenises as one token: the first prompt's last
    token differs, the trajectory's first prompt is one token shorter and the merged token is environment."""
    t1 = turn_of(_event("a", [1, 2, 3], [10, 11, 12, 13]))
    assert t1 is not None
    traj = assemble(t1, [1, 2, 77, 11, 12, 13, 90])
    assert traj is not None and traj.prompt_length == 2
    assert list(traj.environment) == [True, False, False, False, True]
    assert traj.realigned_tokens == 3


def test_edited_history_keeps_only_samples_found_again() -> None:
    """The client rewrote the first answer's middle token (e.g. re-rendered a tool call): the edited token
    and what follows it are environment, except a run of >= 3 sampled tokens found again later."""
    p1 = [1, 2, 3]
    r1 = [10, 11, 12, 13, 14, 15, 16]
    t1 = turn_of(_event("a", p1, r1))
    assert t1 is not None
    edited = [10, 11, 99, 13, 14, 15, 16]
    traj = assemble(t1, p1 + edited + [90, 91])
    assert traj is not None
    assert list(traj.environment) == [False, False, True, False, False, False, False, True, True]
    assert traj.realigned_tokens == 4
    # a coincidence shorter than MIN_REALIGN (a tool result repeating one sampled token) stays environment
    traj = assemble(t1, p1 + [10, 77, 15, 16, 88])
    assert traj is not None
    assert list(traj.environment) == [False, True, True, True, True]


def test_best_picks_the_choice_the_prompt_continues_and_cache_is_bounded() -> None:
    a = turn_of(_event("a", [1, 2], [10, 11, 12]))
    b = turn_of(_event("b", [1, 2], [20, 21, 22]))
    assert a is not None and b is not None
    found = best([a, b], [1, 2, 20, 21, 22, 90])
    assert found is not None and list(found[0].interaction_ids) == ["b"] and found[1] is b
    cache = SessionTurns(max_sessions=2)
    for k in ("s1", "s2", "s3"):
        cache.put(k, [a])
    assert cache.get("s1") == [] and cache.get("s3") == [a]
    assert cache.total_tokens == 2 * len(a.tokens)
    small = SessionTurns(max_total_tokens=2 * len(a.tokens))    # the token budget binds before the count
    for k in ("s1", "s2", "s3"):
        small.put(k, [a])
    assert small.get("s1") == [] and small.get("s2") == [a] and small.total_tokens == 2 * len(a.tokens)
    small.forget("s2")
    assert small.total_tokens == len(a.tokens)


def test_a_request_without_a_session_finds_its_history_by_its_first_tokens() -> None:
    """An OpenAI SDK agent names no session and resends the history: the newest sessions starting with the
    same first HEAD_TOKENS tokens are candidates, and only the one whose first prompt and answer the new
    prompt holds continues (another session of the same agent, same system prompt, does not)."""
    system = list(range(100, 100 + HEAD_TOKENS))
    mine = turn_of(_event("mine", [*system, 1, 2, 3], [10, 11, 12]))
    other = turn_of(_event("other", [*system, 1, 2, 4], [10, 11, 12]))
    assert mine is not None and other is not None
    cache = SessionTurns()
    head = head_key("acme", mine.tokens[:HEAD_TOKENS + 2].tolist())
    assert head == head_key("acme", [*system, 1, 2, 4]) != head_key("globex", [*system, 1, 2, 4])
    assert head != head_key("acme", [*system, 1, 2, 4], caller="another-key")
    cache.put("acme\x00fresh-1", [mine], head)
    cache.put("acme\x00fresh-2", [other], head)
    prompt = [*system, 1, 2, 3, 10, 11, 12, 90, 91]
    found = best(cache.by_head(head_key("acme", prompt)), prompt)
    assert found is not None and found[1] is mine and list(found[0].interaction_ids) == ["mine"]
    assert cache.by_head(head_key("globex", prompt)) == []
    assert head_key("acme", [1, 2, 3]) is None
