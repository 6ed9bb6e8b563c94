"""A session's turns --> one agent trajectory, assembled at capture time, token in, token out.

Why here and not downstream (docs/agents.md, "Agent trajectories"): only the pod that served a turn knows
the tokens it sampled and their behaviour log-probs before the chat template re-renders that turn into the
next prompt. Each served choice is remembered per session (bounded LRU); when the session's next request
arrives, its prompt is aligned with the remembered turn:

1. the remembered turn's trajectory prompt (the first turn's prompt) must be a prefix of the new prompt
   (but for its last `PROMPT_SLACK` tokens, which a tokenizer may merge with the answer that follows),
   else the request starts a new trajectory (another conversation, an edited system prompt, other
   knowledge in context);
2. the longest common prefix of (previous prompt + previous response) and the new prompt keeps its labels:
   the policy's own sampled tokens stay model tokens with their recorded log-probs;
3. past that prefix the history was re-rendered differently or edited: blocks of at least
   `MIN_REALIGN` tokens that still equal sampled tokens are found again (difflib) and stay model tokens
   (counted in `realigned_tokens`; the trainer's truncated importance weights correct for the changed
   context); everything else — tool results, later user turns, template text, edited text — is
   environment, masked out of the loss.

Pure functions plus a small thread-safe cache; no Kafka, no model.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from shared.proto.apprentice.v1 import events_pb2

PROMPT_SLACK = 2
"""Tokens at the end of the first prompt that the next prompt may spell differently: the generation
prompt's last token (`assistant\\n`) merges with an answer that starts with the same character."""

MAX_REALIGN_WORK = 4096 * 4096
"""Realignment (difflib, quadratic at worst) runs on the request's capture path: past this product of the
two tails' lengths, tokens after a divergence stay environment (safe: no gradient) rather than cost time."""

MIN_REALIGN = 3
"""Shortest run of tokens that counts as the policy's own sample found again after a divergence: shorter
coincidences (a common word in a tool result) stay environment."""


@dataclass
class Turn:
    """One served choice as the next turn needs it: its full token sequence and, past the trajectory's
    first prompt, which tokens the policy sampled, with their behaviour log-probs. Packed arrays: a pod
    remembers thousands of sessions (about 13 bytes a token rather than a hundred in lists)."""

    interaction_id: str
    prompt_length: int
    """Length of the trajectory's first prompt (the context never trained on)."""
    tokens: array[int]
    """prompt ids + response ids of this turn (int32)."""
    environment: bytes
    """Over tokens[prompt_length:]: 1 = not sampled by the policy."""
    logprobs: array[float]
    logprobs_t1: array[float]
    interaction_ids: list[str] = field(default_factory=list)
    """Every turn in the trajectory so far, this one last."""
    session_key: str = ""
    """Where SessionTurns keeps it (set by `put`)."""


def turn_of(ev: events_pb2.Interaction) -> Turn | None:
    """The captured Interaction (its trajectory already set, or not) --> the Turn to remember; None when
    its tokens or log-probs were not kept (redacted answers, engines without log-probs)."""
    resp = list(ev.response_token_ids)
    if not resp or not ev.prompt_token_ids or len(ev.response_logprobs_t1) != len(resp):
        return None
    lp = list(ev.response_logprobs) if len(ev.response_logprobs) == len(resp) else list(ev.response_logprobs_t1)
    t = ev.trajectory if ev.HasField("trajectory") else None
    prompt = list(ev.prompt_token_ids)
    if t is not None and not (len(t.environment) == len(t.logprobs) == len(t.logprobs_t1)
                              == len(prompt) - t.prompt_length):
        t = None        # not the shape assemble() writes: the turn starts afresh rather than misalign
    if t is None:
        return Turn(ev.interaction_id, len(prompt), array("i", prompt + resp), bytes(len(resp)), array("f", lp),
                    array("f", ev.response_logprobs_t1), [ev.interaction_id])
    return Turn(ev.interaction_id, t.prompt_length, array("i", prompt + resp),
                bytes(bytearray(t.environment)) + bytes(len(resp)), array("f", [*t.logprobs, *lp]),
                array("f", [*t.logprobs_t1, *ev.response_logprobs_t1]), [*t.interaction_ids, ev.interaction_id])


def assemble(prev: Turn, prompt: Sequence[int]) -> events_pb2.Trajectory | None:
    """The new prompt of a session's next turn, aligned with the turn served before it (module docstring).
    None when it does not continue `prev`: it shares less than the first prompt (but its last
    `PROMPT_SLACK` tokens, which may merge with the next turn's text), or nothing follows it."""
    p0 = prev.prompt_length
    old = prev.tokens
    head = max(1, p0 - PROMPT_SLACK)
    if len(prompt) < head or list(prompt[:head]) != old[:head].tolist():
        return None                     # most candidates end here, compared at C speed
    common = _common_prefix(prompt, old, head)
    start = min(p0, common)             # the trajectory's first prompt, as this prompt spells it
    n = len(prompt) - start
    if n <= 0:
        return None
    env = [True] * n
    lp = [0.0] * n
    lp1 = [0.0] * n

    def keep(src: int, dst: int) -> bool:
        j = src - p0
        if j < 0 or prev.environment[j]:
            return False
        env[dst - start], lp[dst - start], lp1[dst - start] = False, prev.logprobs[j], prev.logprobs_t1[j]
        return True

    for i in range(start, common):
        keep(i, i)
    realigned = 0
    tail_old, tail_new = old[common:].tolist(), list(prompt[common:])
    if tail_old and tail_new and len(tail_old) * len(tail_new) <= MAX_REALIGN_WORK:
        sm = SequenceMatcher(None, tail_old, tail_new, autojunk=False)
        for block in sm.get_matching_blocks():
            if block.size >= MIN_REALIGN:
                realigned += sum(keep(common + block.a + k, common + block.b + k) for k in range(block.size))
    return events_pb2.Trajectory(prompt_length=start, environment=env, logprobs=lp, logprobs_t1=lp1,
                                 interaction_ids=list(prev.interaction_ids), realigned_tokens=realigned)


def _common_prefix(a: Sequence[int], b: array[int], start: int) -> int:
    """Length of the common prefix of a and b, known to be at least `start`: chunk by chunk, then token by
    token in the first chunk that differs."""
    limit, i, chunk = min(len(a), len(b)), start, 256
    while i + chunk <= limit and list(a[i:i + chunk]) == b[i:i + chunk].tolist():
        i += chunk
    while i < limit and a[i] == b[i]:
        i += 1
    return i


def best(prevs: Sequence[Turn], prompt: Sequence[int]) -> tuple[events_pb2.Trajectory, Turn] | None:
    """Of the remembered choices (the n choices of the session's last request, or the candidates of a
    request that names no session), the one this prompt continues: the trajectory with the most model
    tokens (then the longest exact first prompt), and the turn it continues."""
    found = [(t, p) for t, p in ((assemble(p, prompt), p) for p in prevs) if t is not None]
    # ties: the longer exact first prompt, then the fewer tokens found only by realignment
    return max(found, key=lambda tp: (sum(not e for e in tp[0].environment), tp[0].prompt_length,
                                      -tp[0].realigned_tokens), default=None)


HEAD_TOKENS = 32
"""Tokens of a first prompt that index its session for requests that name none (`SessionTurns.by_head`)."""


def head_key(tenant: str, prompt: Sequence[int], caller: str = "") -> str | None:
    """The index of a prompt's first `HEAD_TOKENS` tokens for one caller (tenant and API key id: a request
    never continues another caller's session, whose turns its trajectory would name and the trainer would
    then withdraw); None for shorter prompts."""
    if len(prompt) < HEAD_TOKENS + PROMPT_SLACK:
        return None
    digest = hashlib.blake2b(array("l", prompt[:HEAD_TOKENS]).tobytes(), digest_size=12).hexdigest()
    return f"{tenant}\x00{caller}\x00{digest}"


class SessionTurns:
    """session key --> the choices served for its last request, bounded (least recently used leaves first).
    A pod only knows the turns it served; a session that moves to another pod starts a new trajectory.

    Clients that name no session (an OpenAI SDK agent without `user` or `session_id`) resend the whole
    history instead: their requests find their session by the first `HEAD_TOKENS` tokens of the prompt
    (`by_head`; many sessions of one agent share a system prompt, so the newest `per_head` of them are
    candidates, and `best` keeps the one the prompt continues — the first prompt must match in full)."""

    def __init__(self, max_sessions: int = 4096, max_tokens: int = 32_768, per_head: int = 64,
                 max_total_tokens: int = 8_000_000) -> None:
        """Bounds: sessions, tokens of one turn, candidates per first-tokens index, and tokens held in all
        (8 M tokens: about 100 MB at 13 bytes a token), whichever binds first."""
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self.per_head = per_head
        self.max_total_tokens = max_total_tokens
        self.total_tokens = 0
        self._lock = threading.Lock()
        self._turns: OrderedDict[str, list[Turn]] = OrderedDict()
        self._heads: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()

    def forget(self, key: str) -> None:
        """A session continued under another key (a request that named none): its old entry is spent."""
        with self._lock:
            self._drop(key)

    def _drop(self, key: str, last: bool | None = None) -> None:
        """Remove `key` (or, with `last=False`, the least recently used session); the lock is held."""
        if last is not None:
            _, turns = self._turns.popitem(last=last)
        else:
            turns = self._turns.pop(key, [])
        self.total_tokens -= sum(len(t.tokens) for t in turns)

    def by_head(self, head: str | None) -> list[Turn]:
        """The remembered choices of the newest sessions whose first prompt starts like `head`'s."""
        if head is None:
            return []
        with self._lock:
            keys = list(self._heads.get(head, ()))
            return [t for k in reversed(keys) for t in self._turns.get(k, ())]

    def get(self, key: str) -> list[Turn]:
        with self._lock:
            turns = self._turns.get(key)
            if turns is None:
                return []
            self._turns.move_to_end(key)
            return list(turns)

    def put(self, key: str, turns: list[Turn], head: str | None = None) -> None:
        """Remember `turns` as the session's last choices (none: forget the session); `head` indexes them
        for requests that name no session."""
        turns = [t for t in turns if len(t.tokens) <= self.max_tokens]
        for t in turns:
            t.session_key = key
        with self._lock:
            self._drop(key)
            if not turns:
                return
            self._turns[key] = turns
            self.total_tokens += sum(len(t.tokens) for t in turns)
            while self._turns and (len(self._turns) > self.max_sessions
                                   or self.total_tokens > self.max_total_tokens):
                self._drop("", last=False)
            if head is not None:
                bucket = self._heads.setdefault(head, OrderedDict())
                bucket[key] = None
                bucket.move_to_end(key)
                self._heads.move_to_end(head)
                while len(bucket) > self.per_head:
                    bucket.popitem(last=False)
                while len(self._heads) > self.max_sessions:
                    self._heads.popitem(last=False)
