"""Real protobuf records for trainer tests (GradedInteraction, KnowledgeSnapshot)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.contracts.events import deterministic_id, make_envelope
from shared.proto.apprentice.v1 import common_pb2, events_pb2


def graded(iid: str, *, tenant: str = "acme", reward: float = 1.0, group: str = "", group_size: int = 1,
           version: str = "base", revision: int = 1, has_signal: bool = True, quarantined: bool = False,
           prompt: Sequence[int] = (1, 2, 3), response: Sequence[int] = (4, 5), logprobs_t1: Sequence[float] | None = None,
           task: str = "support", question: str = "what is the warranty?", max_new_tokens: int = 16,
           ) -> events_pb2.GradedInteraction:
    it = events_pb2.Interaction(
        envelope=make_envelope(tenant, source="test"), interaction_id=iid, session_id="s-" + iid, task=task,
        model="tiny-random", policy_version=version, messages=[common_pb2.ChatMessage(role="user", content=question)],
        prompt_token_ids=list(prompt), response_token_ids=list(response),
        response_logprobs_t1=list(logprobs_t1) if logprobs_t1 is not None else [-1.0] * len(response),
        sampling=common_pb2.SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0),
        finish_reason="stop", group_id=group, group_size=group_size,
    )
    return events_pb2.GradedInteraction(
        envelope=make_envelope(tenant, source="test", event_id=deterministic_id(iid, str(revision))),
        interaction=it, revision=revision, reward=reward, has_signal=has_signal, quarantined=quarantined,
    )


def snapshot(tenant: str, domain: str, version: int, items: Sequence[tuple[str, events_pb2.ItemStatus]]
             ) -> events_pb2.KnowledgeSnapshot:
    return events_pb2.KnowledgeSnapshot(
        envelope=make_envelope(tenant, source="test"), key=f"{tenant}/{domain}", domain=domain, version=version,
        items=[events_pb2.KnowledgeItem(item_id=f"i{n}", text=t, status=s) for n, (t, s) in enumerate(items)],
    )
