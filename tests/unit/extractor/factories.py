"""Builders of real GradedInteraction protos for the extractor's tests (no fakes of any service)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.contracts.events import deterministic_id, make_envelope
from shared.proto.apprentice.v1 import common_pb2, events_pb2

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def graded(*, tenant: str = "acme", task: str = "support", session: str = "s1", iid: str = "i1",
           question: str = "How long is the warranty?", answer: str = "One year.",
           history: list[tuple[str, str]] | None = None, revision: int = 1, has_signal: bool = True,
           success: bool = False, reward: float = -1.0, correction: str = "", thumbs: float = 0.0,
           comment: str = "", knowledge_version: str = "", quarantined: bool = False, at_s: int = 0,
           group: tuple[str, int, int] | None = None, asked_by: str = "",
           corrected_by: str = "", in_context: tuple[tuple[str, str], ...] = ()) -> events_pb2.GradedInteraction:
    """One graded interaction; `history` = earlier (user, assistant) rounds of the same session.
    `asked_by` / `corrected_by`: the caller recorded on the interaction / the feedback, as "role:key_id"
    (a backend's tenant is the record's), "" = none recorded."""
    when = T0 + timedelta(seconds=at_s)
    msgs = [common_pb2.ChatMessage(role="system", content="You are the support assistant of Acme.")]
    for u, a in history or []:
        msgs += [common_pb2.ChatMessage(role="user", content=u), common_pb2.ChatMessage(role="assistant", content=a)]
    msgs.append(common_pb2.ChatMessage(role="user", content=question))
    inter = events_pb2.Interaction(
        envelope=_signed(make_envelope(tenant, source="test", occurred_at=when), asked_by, tenant),
        interaction_id=iid, session_id=session,
        task=task, model="tiny-random", policy_version="base", knowledge_version=knowledge_version,
        messages=msgs, response_text=answer, finish_reason="stop",
        knowledge_items=[events_pb2.KnowledgeRef(key=k, item_id=i, revision=1) for k, i in in_context])
    if group is not None:
        inter.group_id, inter.sample_index, inter.group_size = group
    feedback = []
    if correction:
        feedback.append(events_pb2.FeedbackEvent(envelope=_signed(make_envelope(tenant, source="test"), corrected_by,
                                                                  tenant),
                                                 interaction_id=iid, kind="correction", comment=correction))
    if thumbs:
        feedback.append(events_pb2.FeedbackEvent(envelope=_signed(make_envelope(tenant, source="test"), corrected_by,
                                                                  tenant),
                                                 interaction_id=iid, kind="thumbs", value=thumbs, comment=comment))
    return events_pb2.GradedInteraction(
        envelope=make_envelope(tenant, source="grader", event_id=deterministic_id(iid, str(revision)),
                               occurred_at=when),
        interaction=inter, revision=revision, reward=reward, has_signal=has_signal, success=success,
        quarantined=quarantined, feedback=feedback,
        components=[events_pb2.RewardComponent(name="feedback", value=reward, weight=1.0, has_signal=has_signal,
                                               detail="user feedback")])


def _signed(env: common_pb2.Envelope, who: str, tenant: str) -> common_pb2.Envelope:
    """`who` = "role:key_id" --> envelope.principal, as the inference edge records the caller."""
    if who:
        role, _, key_id = who.partition(":")
        env.principal.CopyFrom(common_pb2.Principal(key_id=key_id or role, role=role,
                                                    tenant=tenant if role == "backend" else ""))
    return env
