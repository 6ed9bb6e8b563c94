"""GradedInteraction --> Rollout: the fields the RL loss needs, checked once.

`admit` is the trainer's one filter of graded records: another tenant's record, a quarantined or
no-signal one and a malformed one never become a Rollout. Records from Kafka pass it in the RL buffer
(buffer.py), which adds what only a stream has (revisions, staleness, groups); records handed to the
library entry (`Trainer.rl_round`, rounds.py) pass it there. A Rollout is thus a record already
admitted, and is not filtered again.

`behaviour_logprobs` is `Interaction.response_logprobs_t1` (log softmax at temperature 1, unfiltered):
the same quantity the trainer recomputes for π_θ, so π_old/π_rollout is a like-for-like ratio
(events.proto). It is empty when inference did not record it; those rollouts train without the
truncated-IS correction (w = 1) and are counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.proto.apprentice.v1 import events_pb2

DEFAULT_TENANT = "default"
DEFAULT_DOMAIN = "general"


OTHER_TENANT = "other_tenant"
MALFORMED = "malformed"
NO_SIGNAL = "no_signal"
QUARANTINED = "quarantined"


class MalformedRollout(ValueError):
    """A graded record that cannot be trained on (no tokens). Counted and skipped, never retried."""


@dataclass
class Rollout:
    interaction_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    tenant: str = DEFAULT_TENANT
    task: str = DEFAULT_DOMAIN
    group_id: str = ""
    group_size: int = 1
    behaviour_logprobs: list[float] = field(default_factory=list)
    policy_version: str = "base"
    max_new_tokens: int = 0
    finish_reason: str = "stop"
    revision: int = 1
    environment: list[bool] = field(default_factory=list)
    """Agent trajectories: one flag per completion token, True = the environment's (a tool result, a later
    user turn), masked out of the loss; empty = every completion token is the policy's own."""

    response_start: int = 0
    """Where the last turn's response starts in completion_ids (0 but for trajectories): what
    `max_new_tokens` bounded, and so what DAPO's overlong penalty measures."""

    @property
    def response_length(self) -> int:
        return len(self.completion_ids) - self.response_start

    @property
    def model_tokens(self) -> int:
        """Completion tokens the policy sampled: what the loss and its normalisers count."""
        return len(self.completion_ids) - sum(self.environment)

    @property
    def has_behaviour(self) -> bool:
        return len(self.behaviour_logprobs) == len(self.completion_ids) > 0

    @property
    def grouped(self) -> bool:
        return bool(self.group_id) and self.group_size > 1


def tenant_of(g: events_pb2.GradedInteraction) -> str:
    """The owning tenant: the graded envelope's, which must agree with the interaction's."""
    return g.envelope.tenant or g.interaction.envelope.tenant or DEFAULT_TENANT


def domain_of(task: str) -> str:
    return task or DEFAULT_DOMAIN


def from_graded(g: events_pb2.GradedInteraction) -> Rollout:
    it = g.interaction
    if not it.response_token_ids:
        raise MalformedRollout(f"interaction {it.interaction_id}: no response tokens")
    if not it.prompt_token_ids:
        raise MalformedRollout(f"interaction {it.interaction_id}: no prompt tokens")
    prompt, completion = list(it.prompt_token_ids), list(it.response_token_ids)
    behaviour, environment = list(it.response_logprobs_t1), []
    t = it.trajectory
    if it.HasField("trajectory"):
        # one agent trajectory (services/inference/trajectory.py): the first turn's prompt is the context,
        # everything after it is the completion, the environment's tokens flagged
        p0, rest = t.prompt_length, len(prompt) - t.prompt_length
        if not (0 < p0 < len(prompt) and len(t.environment) == len(t.logprobs_t1) == rest):
            raise MalformedRollout(f"interaction {it.interaction_id}: trajectory does not fit its prompt")
        prompt, completion = prompt[:p0], prompt[p0:] + completion
        environment = [*t.environment, *([False] * len(it.response_token_ids))]
        behaviour = [*t.logprobs_t1, *behaviour] if behaviour else []
    return Rollout(
        interaction_id=it.interaction_id, prompt_ids=prompt,
        completion_ids=completion, reward=float(g.reward), tenant=tenant_of(g),
        task=domain_of(it.task), group_id=it.group_id, group_size=max(1, it.group_size),
        behaviour_logprobs=behaviour, policy_version=it.policy_version or "base",
        max_new_tokens=int(it.sampling.max_new_tokens), finish_reason=it.finish_reason, revision=g.revision,
        environment=environment, response_start=len(completion) - len(it.response_token_ids),
    )


@dataclass(frozen=True)
class Admission:
    """`admit`'s verdict on one graded record: its Rollout, or the reason it may not train (`reason`
    names the skip counter)."""

    rollout: Rollout | None
    reason: str = ""


def admit(g: events_pb2.GradedInteraction, tenant: str) -> Admission:
    """May `g` train `tenant`'s model? Not when it belongs to another tenant (the graded envelope's
    tenant, or an interaction envelope that disagrees with it), has no interaction id, was quarantined
    by the grader (reward hacking suspected) or carries no reward signal, or lacks prompt or response
    tokens (e.g. an answer redacted at capture: its tokens were dropped)."""
    inner = g.interaction.envelope.tenant
    if tenant_of(g) != tenant or (inner and inner != tenant):
        return Admission(None, OTHER_TENANT)
    if not g.interaction.interaction_id:
        return Admission(None, MALFORMED)
    if g.quarantined:
        return Admission(None, QUARANTINED)
    if not g.has_signal:
        return Admission(None, NO_SIGNAL)
    try:
        return Admission(from_graded(g))
    except MalformedRollout:
        return Admission(None, MALFORMED)
