"""GradedInteraction records --> per-session Trajectories (multi-turn, with final result and feedback).

OEL extracts knowledge from whole episodes: every round's input and output, then the final result and the
environment's feedback. A served conversation has no explicit end, so a session's trajectory closes when
no graded record arrived for it for `session_gap_s` seconds (or it reached `max_turns`). Records of open
sessions are *pending*: the consumer must not commit past them (see `SessionBuffer.safe_offsets`).

Grouping: key = "<tenant>/<domain>", domain = the request's task tag ("general" if empty). Samples of one
exploration group (group_size > 1) are alternatives of one turn, so each becomes its own trajectory.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shared.contracts.events import deterministic_id
from shared.proto.apprentice.v1 import common_pb2, events_pb2

DEFAULT_TENANT = "default"
DEFAULT_DOMAIN = "general"


def knowledge_key(tenant: str, task: str) -> str:
    """The knowledge base a record belongs to: "<tenant>/<domain>" (`split_key` reverses it)."""
    return f"{tenant or DEFAULT_TENANT}/{task.strip() or DEFAULT_DOMAIN}"


def split_key(key: str) -> tuple[str, str]:
    tenant, _, domain = key.partition("/")
    return tenant, domain or DEFAULT_DOMAIN


TRUSTED_ROLES = ("operator", "service")
"""Callers whose words may become knowledge without a review (where a tenant opts in): operators and
trusted agents (service credentials). Backend keys carry end users' text; anonymous callers and events
without a recorded caller are unknown."""


@dataclass(frozen=True)
class Source:
    """Who caused an event: its envelope's principal as plain values (a frozen Turn can hold it)."""

    key_id: str = ""
    role: str = ""                  # backend | operator | service | anonymous; "" = not recorded
    tenant: str = ""
    event_id: str = ""

    @property
    def trusted(self) -> bool:
        return self.role in TRUSTED_ROLES

    def principal(self) -> common_pb2.Principal:
        return common_pb2.Principal(key_id=self.key_id, role=self.role, tenant=self.tenant)

    @staticmethod
    def of(env: common_pb2.Envelope) -> Source:
        p = env.principal
        return Source(key_id=p.key_id, role=p.role, tenant=p.tenant, event_id=env.event_id)


def least_trusted(sources: Iterable[Source]) -> Source:
    """The first untrusted source, else the first one: what an item derived from all of them may claim."""
    seen = list(sources)
    return next((s for s in seen if not s.trusted), seen[0] if seen else Source())


@dataclass(frozen=True)
class Turn:
    """One graded interaction as a round of a trajectory."""

    interaction_id: str
    revision: int
    input_text: str                 # what the user (or environment) said in this round
    output_text: str                # the policy's answer
    user_texts: tuple[str, ...]     # every user message in the prompt (PII: names are looked up here)
    has_signal: bool                # a grader could judge it and it is not quarantined
    success: bool
    reward: float
    feedback: tuple[str, ...]       # human-readable reasons: corrections, thumbs, grader details, flags
    corrections: tuple[str, ...]    # correction texts (the corrected answers)
    knowledge_version: str          # knowledge snapshot that was in context ("" if none)
    policy_version: str
    occurred_at: float              # seconds since the epoch (the interaction's envelope)
    asked_by: Source = Source()     # the caller of the Generate request
    corrected_by: tuple[Source, ...] = ()   # the caller of each correction, same order as `corrections`
    feedback_by: tuple[Source, ...] = ()    # the caller of every feedback event joined to this turn
    knowledge_items: tuple[tuple[str, str], ...] = ()   # (key, item id) of each item that was in its context

    @property
    def ref(self) -> str:
        return f"{self.interaction_id}@{self.revision}"

    @property
    def informative(self) -> bool:
        """Something to learn from: a judged outcome or a correction."""
        return self.has_signal or bool(self.corrections)


def _turn_input(inter: events_pb2.Interaction) -> str:
    """The new input of this round: the trailing non-assistant messages of the prompt. System messages
    are deployment context shared by every round, not what this round asked, so they are left out."""
    msgs = list(inter.messages)
    tail: list[common_pb2.ChatMessage] = []
    for m in reversed(msgs):
        if m.role == "assistant":
            break
        if m.role != "system":
            tail.append(m)
    tail.reverse()
    if not tail:
        return inter.prompt_text
    if len(tail) == 1 and tail[0].role != "tool":
        return tail[0].content
    names = {c.id: c.name for m in msgs for c in m.tool_calls}
    return "\n".join(_message_line(m, names) for m in tail)


def _message_line(m: common_pb2.ChatMessage, names: dict[str, str]) -> str:
    """One message of a round's input. A tool result says which function returned it (agent trajectories,
    docs/agents.md): knowledge such as "the lookup of an order returns its carrier" needs the call's name,
    given by the message or by the assistant's call it answers."""
    if m.role == "tool":
        name = m.name or names.get(m.tool_call_id, "") or "a function"
        return f"[tool result of {name}{f' (call {m.tool_call_id})' if m.tool_call_id else ''}] {m.content}"
    return f"[{m.role}] {m.content}"


def _turn_output(inter: events_pb2.Interaction) -> str:
    """The policy's answer of this round: its text, or the tool calls it made (name and arguments), which
    are what an agent's turn decides and what the extractor must be able to read."""
    calls = [f"[tool call] {c.name}({c.arguments})" for c in inter.response_tool_calls]
    if not calls:
        return inter.response_text
    return "\n".join(calls)


def _feedback_lines(g: events_pb2.GradedInteraction) -> tuple[list[str], list[str], list[Source]]:
    lines: list[str] = []
    corrections: list[str] = []
    correctors: list[Source] = []
    for fb in g.feedback:
        comment = fb.comment.strip()
        if fb.kind == "correction" and comment:
            corrections.append(comment)
            correctors.append(Source.of(fb.envelope))
            lines.append(f'The user corrected the answer; the right answer is: "{comment}"')
        elif fb.kind == "thumbs":
            lines.append(("Thumbs up" if fb.value > 0 else "Thumbs down") + (f': "{comment}"' if comment else ""))
        elif fb.kind == "rating":
            lines.append(f"Rating {fb.value:g}/5" + (f': "{comment}"' if comment else ""))
        elif fb.kind == "kpi":
            lines.append(f"KPI {fb.kpi_name or 'value'} = {fb.value:g}")
        elif comment:
            lines.append(f"{fb.kind or 'feedback'}: \"{comment}\"")
    for c in g.components:
        if c.has_signal and c.detail:
            lines.append(f"Grader {c.name}: {c.value:+.2f} ({c.detail})")
    if g.flags:
        lines.append("Flags: " + ", ".join(g.flags))
    if not g.has_signal and g.no_signal_reason:
        lines.append(f"No reward signal: {g.no_signal_reason}")
    return lines, corrections, correctors


def turn_from_graded(g: events_pb2.GradedInteraction) -> Turn:
    """One graded record --> a Turn. Success = the grader's task success, or a positive reward."""
    inter = g.interaction
    lines, corrections, correctors = _feedback_lines(g)
    has_signal = g.has_signal and not g.quarantined
    ts = inter.envelope.occurred_at if inter.HasField("envelope") else g.envelope.occurred_at
    return Turn(
        interaction_id=inter.interaction_id,
        revision=int(g.revision),
        input_text=_turn_input(inter),
        output_text=_turn_output(inter),
        user_texts=tuple(m.content for m in inter.messages if m.role == "user"),
        has_signal=has_signal,
        success=bool(has_signal and (g.success or g.reward > 0)),
        reward=float(g.reward),
        feedback=tuple(lines),
        corrections=tuple(corrections),
        knowledge_version=inter.knowledge_version,
        knowledge_items=tuple((r.key, r.item_id) for r in inter.knowledge_items),
        policy_version=inter.policy_version,
        occurred_at=ts.seconds + ts.nanos / 1e9,
        asked_by=Source.of(inter.envelope),
        corrected_by=tuple(correctors),
        feedback_by=tuple(Source.of(fb.envelope) for fb in g.feedback),
    )


@dataclass
class Trajectory:
    """The rounds of one session (one OEL episode) with its outcome."""

    tenant: str
    domain: str
    session_id: str
    turns: list[Turn]

    @property
    def key(self) -> str:
        return knowledge_key(self.tenant, self.domain)

    @property
    def outcome_turn(self) -> Turn | None:
        """The last turn with a judged outcome, else the last corrected turn."""
        for t in reversed(self.turns):
            if t.has_signal:
                return t
        for t in reversed(self.turns):
            if t.corrections:
                return t
        return None

    @property
    def success(self) -> bool | None:
        """Final result: success/failure of the last judged turn; a correction alone means failure."""
        t = self.outcome_turn
        if t is None:
            return None
        return t.success if t.has_signal else False

    @property
    def reward(self) -> float:
        t = self.outcome_turn
        return t.reward if t is not None and t.has_signal else 0.0

    @property
    def feedback(self) -> list[str]:
        out: list[str] = []
        for i, t in enumerate(self.turns, start=1):
            prefix = f"Round{i}: " if len(self.turns) > 1 else ""
            out.extend(prefix + line for line in t.feedback)
        return out

    @property
    def corrections(self) -> list[tuple[Turn, str]]:
        return [(t, c) for t in self.turns for c in t.corrections]

    @property
    def sourced_corrections(self) -> list[tuple[Turn, str, Source]]:
        """Each correction with the turn it corrects and who sent it."""
        return [(t, c, t.corrected_by[i] if i < len(t.corrected_by) else Source())
                for t in self.turns for i, c in enumerate(t.corrections)]

    @property
    def sources(self) -> list[Source]:
        """Every caller whose words are in this trajectory: the askers and the feedback senders."""
        return [s for t in self.turns for s in (t.asked_by, *t.feedback_by)]

    @property
    def user_texts(self) -> list[str]:
        """What users wrote: their messages and their corrections (a name given only in a correction is
        still a name to keep out of knowledge)."""
        return [u for t in self.turns for u in (*t.user_texts, *t.corrections)]

    @property
    def interaction_ids(self) -> list[str]:
        return [t.interaction_id for t in self.turns]

    @property
    def trajectory_id(self) -> str:
        return deterministic_id("trajectory", self.key, self.session_id, *sorted(t.ref for t in self.turns))

    @property
    def seed(self) -> int:
        """Sampling seed derived from the content: a redelivered trajectory samples the same items. Kept
        below 2**31 because samplers scale seeds into 64-bit generator states."""
        return int(hashlib.sha256(self.trajectory_id.encode()).hexdigest()[:7], 16) or 1

    @property
    def informative(self) -> bool:
        return any(t.informative for t in self.turns)


@dataclass
class _OpenSession:
    tenant: str
    domain: str
    session_id: str
    turns: dict[str, Turn] = field(default_factory=dict)        # interaction id -> highest revision
    offsets: set[tuple[str, int, int]] = field(default_factory=set)  # (topic, partition, offset) pending
    last_seen: float = 0.0
    order: dict[str, int] = field(default_factory=dict)


class SessionBuffer:
    """Open sessions collecting turns until they close; tracks which offsets are still pending."""

    def __init__(self, gap_s: float, max_turns: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.gap_s = gap_s
        self.max_turns = max_turns
        self._clock = clock
        self._open: dict[tuple[str, str, str], _OpenSession] = {}
        self._consumed: dict[tuple[str, int], int] = {}   # (topic, partition) -> highest offset seen
        self._seq = 0

    def __len__(self) -> int:
        return len(self._open)

    def add(self, g: events_pb2.GradedInteraction, *, topic: str = "", partition: int = 0,
            offset: int = -1) -> None:
        """Add one graded record; a lower or equal revision of a known turn is ignored."""
        inter = g.interaction
        tenant = g.envelope.tenant or inter.envelope.tenant or DEFAULT_TENANT
        domain = inter.task.strip() or DEFAULT_DOMAIN
        session = inter.session_id or inter.interaction_id
        if inter.group_size > 1:
            session = f"{session}#{inter.group_id}/{inter.sample_index}"
        sk = (tenant, domain, session)
        s = self._open.get(sk)
        if s is None:
            s = self._open[sk] = _OpenSession(tenant, domain, session)
        turn = turn_from_graded(g)
        old = s.turns.get(turn.interaction_id)
        if old is None or turn.revision > old.revision:
            s.turns[turn.interaction_id] = turn
            if old is None:
                self._seq += 1
                s.order[turn.interaction_id] = self._seq
        if offset >= 0:
            s.offsets.add((topic, partition, offset))
            tp = (topic, partition)
            self._consumed[tp] = max(self._consumed.get(tp, -1), offset)
        s.last_seen = self._clock()

    def note_consumed(self, topic: str, partition: int, offset: int) -> None:
        """A record that needs no session (e.g. dead-lettered) may still be committed past."""
        tp = (topic, partition)
        self._consumed[tp] = max(self._consumed.get(tp, -1), offset)

    def ready(self, *, flush_all: bool = False) -> list[tuple[Trajectory, frozenset[tuple[str, int, int]]]]:
        """Sessions that closed (idle for gap_s or max_turns reached), as trajectories with their offsets.
        They stay in the buffer until `release`d, so a failed extraction is retried on the next poll."""
        now = self._clock()
        out = []
        for s in self._open.values():
            if flush_all or now - s.last_seen >= self.gap_s or len(s.turns) >= self.max_turns:
                turns = sorted(s.turns.values(), key=lambda t: (t.occurred_at, s.order[t.interaction_id]))
                out.append((Trajectory(s.tenant, s.domain, s.session_id, turns[-self.max_turns:]),
                            frozenset(s.offsets)))
        return out

    def release(self, trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            self._open.pop((t.tenant, t.domain, t.session_id), None)

    def safe_offsets(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the next offset that may be committed: just past everything consumed,
        but never past the first record of a session that is still open (it would be lost on a crash)."""
        out = {tp: hi + 1 for tp, hi in self._consumed.items()}
        for s in self._open.values():
            for topic, part, off in s.offsets:
                tp = (topic, part)
                out[tp] = min(out.get(tp, off), off)
        return out
