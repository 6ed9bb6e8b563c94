"""Extraction prompts --> completions from the current policy, through the Inference gRPC service.

On-policy consistency (OEL): the model that serves users is the one that writes their knowledge. Each
request carries the trajectory's tenant, so a tenant-owned policy version extracts that tenant's
knowledge. `no_capture` keeps extraction prompts out of the interactions topic (they are not user traffic).
The requests of a batch are sent concurrently; the inference engine batches them.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.extractor.llm import ExtractorLLM, LLMRequest, LLMResponse, LLMUnavailable
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from shared.rpc.grpc_util import TENANT_METADATA
from shared.security.channels import open_channel

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL}
EXTRACTION_TASK = "apprentice.knowledge-extraction"


class InferenceLLM(ExtractorLLM):
    name = "inference"

    def __init__(self, target: str, *, model: str = "", timeout_s: float = 120.0) -> None:
        self.target = target
        self.model = model
        self.timeout_s = timeout_s
        self._channel = open_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)

    def _request(self, r: LLMRequest) -> inference_pb2.GenerateRequest:
        return inference_pb2.GenerateRequest(
            messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in r.messages],
            sampling=common_pb2.SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                                               top_p=r.top_p, top_k=r.top_k, seed=r.seed, n=1, stop=list(r.stop)),
            tenant=r.tenant, task=EXTRACTION_TASK, no_capture=True)

    def complete(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        futures = [self._stub.Generate.future(self._request(r), timeout=self.timeout_s,
                                              metadata=((TENANT_METADATA, r.tenant),)) for r in requests]
        out: list[LLMResponse] = []
        for fut in futures:
            try:
                resp = fut.result()
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                if code in RETRYABLE:
                    for f in futures:
                        f.cancel()
                    raise LLMUnavailable(f"inference at {self.target}: {code.name}: {e.details()}") from e
                out.append(LLMResponse(text="", model=self.model, error=f"{code.name}: {e.details()}"))
                continue
            text = resp.choices[0].text if resp.choices else ""
            out.append(LLMResponse(text=text, model=self.model, policy_version=resp.policy_version))
        return out

    def close(self) -> None:
        self._channel.close()
