"""Judge chat messages --> judge text, through a swappable backend (the Inference service by default).

`JudgeBackend.complete(messages, spec)` returns the judge model's text or raises `JudgeUnavailable`;
the judge stage turns a failure into *no signal* for the group, never into a reward.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import grpc

from services.grader import metrics as M
from services.grader.core.judge import JudgeScore, build_messages, score_group
from shared.grading import JudgeSpec
from shared.proto.apprentice.v1 import common_pb2, events_pb2, inference_pb2, inference_pb2_grpc
from shared.security.channels import auth_metadata, open_aio_channel


class JudgeUnavailable(RuntimeError):
    """The judge could not answer (transport error, deadline). Recoverable: no signal for this group."""


class JudgeBackend(abc.ABC):
    @abc.abstractmethod
    async def complete(self, messages: Sequence[tuple[str, str]], spec: JudgeSpec) -> str:
        """The judge model's reply to `messages` (role, content); raise JudgeUnavailable on failure."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class InferenceJudge(JudgeBackend):
    """Calls `apprentice.v1.Inference/Generate` with `no_capture=True`: judge calls must never become
    interactions that are graded and trained on themselves."""

    def __init__(self, endpoint: str, *, tenant: str = "grader") -> None:
        self.endpoint = endpoint
        self.tenant = tenant
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, endpoint: str) -> inference_pb2_grpc.InferenceStub:
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = self._channels[endpoint] = open_aio_channel(endpoint)
        return inference_pb2_grpc.InferenceStub(ch)

    async def complete(self, messages: Sequence[tuple[str, str]], spec: JudgeSpec) -> str:
        req = inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in messages],
            sampling=common_pb2.SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                                               n=1, seed=1234),
            tenant=self.tenant, task="grader-judge", no_capture=True)
        try:
            resp = await self._stub(spec.endpoint or self.endpoint).Generate(req, timeout=spec.timeout_s,
                                                                             metadata=auth_metadata())
        except grpc.aio.AioRpcError as e:
            raise JudgeUnavailable(f"{e.code().name}: {e.details()}") from e
        if not resp.choices:
            raise JudgeUnavailable("the judge returned no choices")
        return str(resp.choices[0].text)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


async def judge_group(backend: JudgeBackend, spec: JudgeSpec,
                      members: Sequence[events_pb2.Interaction]) -> list[JudgeScore]:
    """One judge grader over one group: the judge's scores, or *no signal* for every member when the
    judge cannot be reached or read (never a reward)."""
    try:
        text = await backend.complete(build_messages(spec.rubric, members), spec)
    except JudgeUnavailable as e:
        M.JUDGE_CALLS.labels("unavailable").inc()
        return score_group(members, None, str(e))
    scores = score_group(members, text)
    M.JUDGE_CALLS.labels("scored" if scores[0].has_signal else "unreadable").inc()
    return scores


def make_judge_backend(name: str, *, endpoint: str, tenant: str = "grader") -> JudgeBackend:
    """Factory: `inference` (the Apprentice Inference service). Raises on an unknown name."""
    if name == "inference":
        return InferenceJudge(endpoint, tenant=tenant)
    raise ValueError(f"unknown judge backend {name!r} (known: inference)")
