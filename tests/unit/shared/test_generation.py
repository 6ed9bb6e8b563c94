"""`generate` (the one decode loop, prompts in, samples out) on the tiny random model: batching, log-prob
semantics, seeds, stops, and equality with independent references (HF `generate`, a cache-free sampler)."""

from __future__ import annotations

import math

import pytest
import torch

from shared.decoding.forward import last_position_only
from shared.decoding.generation import encode_prompt, generate, render_chat
from shared.decoding.logprobs import filter_top_k_top_p, sequence_logprobs
from shared.decoding.params import SamplingConfig
from shared.decoding.text import eos_ids_of


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str):
    from shared.models import load_model

    return load_model(tiny_model_name)


def test_filter_keeps_top_k_and_nucleus_by_hand() -> None:
    # probs of logits log([0.5, 0.3, 0.15, 0.05]): top_p=0.7 keeps 0.5 and 0.3 (0.5 < 0.7 before the 2nd)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = filter_top_k_top_p(logits, top_k=torch.tensor([0, 3]), top_p=torch.tensor([0.7, 1.0]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(out[1]).tolist() == [True, True, True, False]
    renorm = torch.softmax(out[0], -1)
    assert renorm[0].item() == pytest.approx(0.5 / 0.8)


def test_batched_greedy_equals_one_by_one_and_t1_logprobs_recompute(tiny) -> None:
    model, tok = tiny
    prompts = [render_chat(tok, [{"role": "user", "content": q}]) for q in ("hi", "a much longer question here?")]
    batched = generate(model, tok, prompts, max_new_tokens=8)
    for p, b in zip(prompts, batched, strict=True):
        single = generate(model, tok, [p], max_new_tokens=8)[0][0]
        assert single.token_ids == b[0].token_ids
        assert b[0].logprobs == [0.0] * len(b[0].token_ids)  # greedy: a point mass
        ref = sequence_logprobs(model, encode_prompt(tok, p), b[0].token_ids)
        assert torch.allclose(ref, torch.tensor(b[0].logprobs_t1), atol=1e-4)


def test_sampling_logprobs_are_of_the_filtered_distribution_and_seeded(tiny) -> None:
    model, tok = tiny
    cfg = SamplingConfig(max_new_tokens=6, temperature=0.7, top_k=5, seed=11, n=3)
    a = generate(model, tok, ["hello"], cfg)[0]
    b = generate(model, tok, ["hello"], cfg)[0]
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert len({tuple(s.token_ids) for s in a}) > 1  # distinct streams per sample
    for s in a:
        assert len(s.logprobs) == len(s.logprobs_t1) == len(s.token_ids)
        # filtering to 5 tokens at T<1 concentrates mass: behaviour log-prob >= log(1/5) is not guaranteed,
        # but it must be a valid log-prob and differ from the T=1 view
        assert all(lp <= 0.0 for lp in s.logprobs) and s.logprobs != s.logprobs_t1
    top1 = generate(model, tok, ["hello"], SamplingConfig(max_new_tokens=4, temperature=1.0, top_k=1, seed=3))[0][0]
    greedy = generate(model, tok, ["hello"], max_new_tokens=4)[0][0]
    assert top1.token_ids == greedy.token_ids and all(math.isclose(x, 0.0, abs_tol=1e-6) for x in top1.logprobs)


def test_stop_strings_and_per_prompt_params(tiny) -> None:
    model, tok = tiny
    free = generate(model, tok, ["hello"], max_new_tokens=12)[0][0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_at = free.text[len(free.text) // 2: len(free.text) // 2 + 2]
    if stop_at.strip():
        cut = generate(model, tok, ["hello"], max_new_tokens=12, stop=(stop_at,))[0][0]
        assert cut.finish_reason == "stop" and stop_at not in cut.text and free.text.startswith(cut.text)
    mixed = generate(model, tok, ["hello", "bye"], [SamplingConfig(max_new_tokens=3), SamplingConfig(max_new_tokens=5)])
    assert [len(m[0].token_ids) for m in mixed] == [3, 5]


def test_greedy_equals_hugging_face_generate_with_the_last_position_optimisation_on(tiny) -> None:
    """The loop asks for the last position's logits only and batches left-padded rows; Hugging Face's own
    greedy `generate`, one prompt at a time with full logits, gives the same tokens."""
    model, tok = tiny
    assert last_position_only(model) == {"logits_to_keep": 1}
    prompts = [encode_prompt(tok, render_chat(tok, [{"role": "user", "content": q}]))
               for q in ("hi", "a much longer question here, with more words?", "why")]
    ours = [s[0].token_ids for s in generate(model, tok, prompts, max_new_tokens=10)]
    eos = sorted(eos_ids_of(model, tok))
    for p, got in zip(prompts, ours, strict=True):
        ids = torch.tensor([p])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0])[0, len(p):].tolist()
        assert got == ref


def _reference_sample(model, p: list[int], cfg: SamplingConfig, sample_index: int) -> tuple[list[int], list[float]]:  # noqa: ANN001
    """One row, no KV cache, no batch: the full sequence forward each step, the filter and the seeded
    draw written out from the definitions (shared/decoding/logprobs.py)."""
    g = torch.Generator()
    g.manual_seed((cfg.seed or 0) * 1000003 + sample_index)
    ids, lps = list(p), []
    for _ in range(cfg.max_new_tokens):
        with torch.no_grad():
            z = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        s = z / cfg.temperature
        order = torch.argsort(s, descending=True)
        keep = torch.arange(len(s)) < (cfg.top_k or len(s))
        probs = torch.softmax(s[order].masked_fill(~keep, float("-inf")), -1)
        keep &= (torch.cumsum(probs, -1) - probs) < cfg.top_p
        filtered = torch.full_like(s, float("-inf"))
        filtered[order[keep]] = s[order[keep]]
        p_b = torch.softmax(filtered, -1)
        t = int(torch.multinomial(p_b, 1, generator=g))
        ids.append(t)
        lps.append(float(torch.log(p_b[t])))
    return ids[len(p):], lps


def test_seeded_sampling_equals_a_cache_free_reference(tiny) -> None:
    """Same seed, same tokens and behaviour log-probs as drawing each token by hand from the full-sequence
    logits: the batch, left padding, KV cache, shared prefill of n samples and filter change nothing."""
    model, tok = tiny
    prompts = [encode_prompt(tok, render_chat(tok, [{"role": "user", "content": q}])) for q in ("hello", "tell me more")]
    cfg = SamplingConfig(max_new_tokens=8, temperature=0.8, top_k=9, top_p=0.9, seed=17, n=2)
    out = generate(model, tok, prompts, cfg)
    eos = eos_ids_of(model, tok)
    for p, samples in zip(prompts, out, strict=True):
        for i, smp in enumerate(samples):
            ids, lps = _reference_sample(model, p, cfg, i)
            n = next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))   # the loop stops at EOS
            assert smp.token_ids == ids[:n]
            assert smp.logprobs == pytest.approx(lps[:n], abs=1e-4)
