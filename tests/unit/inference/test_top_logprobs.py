"""OpenAI `top_logprobs` alternatives: from the same distribution as the recorded behaviour log-prob, in the
decode loop (`top_alternatives`) and from vLLM's raw top-K output (`alternatives_from_raw`, no GPU here),
and their OpenAI shape (services/inference/openai_api/responses.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch

from shared.decoding.logprobs import alternatives_from_raw, behaviour_logprob, top_alternatives


def _rows(temp: list[float], top_k: list[int], top_p: list[float]) -> tuple[torch.Tensor, ...]:
    return torch.tensor(temp), torch.tensor(top_k), torch.tensor(top_p)


def test_decode_loop_alternatives_are_the_behaviour_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    temp, top_k, top_p = _rows([0.7, 1.0, 0.0], [0, 3, 0], [1.0, 1.0, 1.0])
    ids, vals = top_alternatives(logits, temp, top_k, top_p, 5)
    assert ids[0] == torch.topk(logits[0], 5).indices.tolist()
    expected = torch.log_softmax(logits[0] / 0.7, dim=-1)[ids[0]].tolist()
    assert vals[0] == pytest.approx(expected, abs=1e-5) and vals[0] == sorted(vals[0], reverse=True)
    # top-k 3: the three kept hold all the mass, the rest were filtered out
    assert math.fsum(math.exp(v) for v in vals[1][:3]) == pytest.approx(1.0, abs=1e-5)
    assert vals[1][3:] == [float("-inf")] * 2
    # greedy: the point mass its recorded 0.0 comes from
    assert ids[2][0] == int(torch.argmax(logits[2])) and vals[2] == [0.0] + [float("-inf")] * 4


def test_vllm_raw_topk_maps_to_the_same_alternatives() -> None:
    torch.manual_seed(1)
    logits = torch.randn(40)
    raw_all = torch.log_softmax(logits, dim=-1)
    top20 = torch.topk(raw_all, 20)
    raw = {int(t): float(v) for t, v in zip(top20.indices, top20.values, strict=True)}
    temp, top_k, top_p = _rows([0.8], [6], [1.0])
    ids, vals = top_alternatives(logits[None], temp, top_k, top_p, 4)
    mapped = alternatives_from_raw(raw, 0.8, 6, 1.0, 4)
    assert [t for t, _ in mapped] == ids[0]
    assert [v for _, v in mapped] == pytest.approx(vals[0], abs=1e-5)      # exact: top-k <= K
    assert all(v == behaviour_logprob(t, raw, 0.8, 6, 1.0) for t, v in mapped)
    greedy = alternatives_from_raw(raw, 0.0, 0, 1.0, 3)
    assert [t for t, _ in greedy] == ids[0][:3] and [v for _, v in greedy] == [0.0, float("-inf"), float("-inf")]
    assert alternatives_from_raw(raw, 1.0, 0, 1.0, 0) == []


def test_vllm_engine_maps_its_raw_sets_only_when_asked() -> None:
    from services.inference.engines.vllm_engine import VLLMEngine  # imports without vLLM installed
    from shared.decoding.params import SamplingConfig

    raws: list[Mapping[int, float]] = [{5: -0.1, 7: -2.5, 9: -4.0}, {1: -0.3, 2: -1.4}]
    assert VLLMEngine._alternatives(SamplingConfig(temperature=1.0), raws) == []
    got = VLLMEngine._alternatives(SamplingConfig(temperature=1.0, top_logprobs=2), raws)
    assert got == [[(5, -0.1), (7, -2.5)], [(1, -0.3), (2, -1.4)]]
