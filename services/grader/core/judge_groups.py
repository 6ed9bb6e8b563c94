"""A judge group + one arriving interaction --> the group to keep, or the members to judge now (pure).

An LLM judge scores the responses to one prompt together (RULER, see judge.py), so the judge stage
collects a group's members (`group_id`, `group_size`) before it calls the judge; after `group_wait_s`
it judges whatever has arrived. Both runtimes keep groups in a changelog-backed table keyed by group
id and apply these rules to it, so a group is judged the same way whichever runtime runs.

Table value: JSON {"created": epoch seconds, "members": [base64 Interaction bytes]}.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from services.grader.core.join import encode_judge
from services.grader.core.judge import JudgeScore
from shared.grading import JudgeSpec, TaskGraders
from shared.proto.apprentice.v1 import events_pb2


@dataclass
class JudgeGroup:
    created: float
    members: list[bytes] = field(default_factory=list)
    """`Interaction` records in arrival order, one per interaction id."""

    def encode(self) -> bytes:
        return json.dumps({"created": self.created,
                           "members": [base64.b64encode(m).decode() for m in self.members]}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> JudgeGroup:
        data = json.loads(raw)
        return cls(float(data["created"]), [base64.b64decode(m) for m in data["members"]])

    def interactions(self) -> list[events_pb2.Interaction]:
        return [events_pb2.Interaction.FromString(m) for m in self.members]


@dataclass(frozen=True)
class GroupStep:
    group: JudgeGroup | None
    """The group to keep in the table; None = no group under this key any more (judged, or never kept)."""
    changed: bool
    """The table entry must be written (set, or deleted when `group` is None)."""
    ready: list[events_pb2.Interaction] = field(default_factory=list)
    """Members to judge now (empty: nothing to judge yet)."""


def add_member(group: JudgeGroup | None, it: events_pb2.Interaction, raw: bytes, task: TaskGraders | None,
               now: float) -> GroupStep:
    """A group member arrives. Complete groups are judged at once; a repeated member changes nothing."""
    judges = judges_of(task)
    if not judges:
        return GroupStep(group, False)
    members = group.interactions() if group is not None else []
    if any(m.interaction_id == it.interaction_id for m in members):
        return GroupStep(group, False)
    members.append(it)
    size = max(1, it.group_size) if all(j.group_relative for j in judges) else 1
    if len(members) >= size:
        return GroupStep(None, group is not None, members)
    kept = JudgeGroup(group.created if group is not None else now, [*(group.members if group else []), raw])
    return GroupStep(kept, True)


def due(group: JudgeGroup, task: TaskGraders | None) -> float:
    """When a group that is still incomplete is judged with the members it has."""
    judges = judges_of(task)
    return group.created + (max(j.group_wait_s for j in judges) if judges else 0.0)


def judges_of(task: TaskGraders | None) -> list[JudgeSpec]:
    return task.judges if task is not None else []


def judge_items(spec: JudgeSpec, scores: list[JudgeScore]) -> list[tuple[bytes, bytes]]:
    """One judge grader's scores --> join items (interaction id, judge result) for the pending table."""
    return [(sc.interaction_id.encode(), encode_judge(sc.interaction_id, spec.name, sc.value, sc.has_signal,
                                                      sc.detail)) for sc in scores]
